"""Small, fixed-size summaries of a tensor: statistics, range hazards, and a sketch for divergence.

Hooks see every module output of a model; keeping those tensors would hold a second copy of all
activations. Instead each tensor is reduced on its own device to a vector of ``STAT_NAMES`` (read
back to the host once, after the pass, so the hooks never force a GPU synchronisation) and, when
asked, to a 1024-number *sketch* from which the relative error between two runs can be estimated.

Range hazards, the reason a change "worked in fp32 and broke in half precision":

* ``fp16_overflow_frac``: finite values with ``|x| > 65504``, the largest float16; cast to fp16 they
  become ``inf``.
* ``fp16_underflow_frac``: non-zero finite values with ``|x| < 2**-24``, below the smallest fp16
  subnormal; cast to fp16 they flush to zero (the reason AMP scales the loss before backward).
* ``bf16_unsafe_frac``: finite values with ``|x| >= 256`` (``BF16_UNSAFE``). bfloat16 keeps float32's
  exponent, so it rarely overflows, but it has only 8 significant bits: from 256 upwards neighbouring
  bf16 numbers are 2 or more apart, so integers stop being exact and any addend below 1 -- a residual
  update, a logit difference, an accumulated sum's next term -- is rounded away entirely. Activations
  that live there are where bf16 silently loses the signal.

NaN and Inf are counted separately (``nan_frac``, ``inf_frac``); every other statistic is taken over
the finite values only, so a single Inf does not turn the mean and the maximum into Inf as well.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "BF16_UNSAFE",
    "FP16_MAX",
    "FP16_MIN_SUBNORMAL",
    "SKETCH_SIZE",
    "STAT_NAMES",
    "relative_error",
    "sketch",
    "stats_dict",
    "summarize",
]

FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL = 2.0**-24
BF16_UNSAFE = 256.0

#: The entries of a summary vector, in order.
STAT_NAMES: tuple[str, ...] = (
    "numel",
    "mean",
    "std",
    "absmax",
    "min",
    "max",
    "l2",
    "nan_frac",
    "inf_frac",
    "zero_frac",
    "fp16_overflow_frac",
    "fp16_underflow_frac",
    "bf16_unsafe_frac",
)

#: Number of float64 buckets in a sketch (8 KiB per tensor).
SKETCH_SIZE = 1024
# Row-sign period: a prime, so two elements of one bucket share their row sign only when they lie
# SKETCH_SIZE * period (67 million) elements apart.
_ROW_PERIOD = 65537
_SIGNS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


@torch.no_grad()
def summarize(x: torch.Tensor) -> torch.Tensor:
    """The ``STAT_NAMES`` of ``x`` as one float64 vector (on ``x``'s device for accelerators).

    Two paths give the same numbers. On the CPU, where reading a value back costs nothing, one sum
    decides whether the tensor is all finite (a NaN or Inf makes the sum non-finite) and the range
    ``[min, max]`` decides which hazard counts can be non-zero, so a typical activation takes about
    six passes. On an accelerator every statistic is computed with masked tensor ops and nothing is
    read back, so recording never stalls the device queue (about twenty small kernels per tensor).
    """
    xf = x.detach()
    if xf.dtype != torch.float64:
        xf = xf.float()
    if xf.numel() == 0:
        out = torch.full((len(STAT_NAMES),), math.nan, dtype=torch.float64, device=xf.device)
        out[0] = 0.0
        return out
    xf = xf.reshape(-1)
    if xf.device.type == "cpu":
        total = xf.sum().item()
        if math.isfinite(total):
            return _summarize_finite_host(xf, total)
    return _summarize_masked(xf)


def _summarize_finite_host(xf: torch.Tensor, total: float) -> torch.Tensor:
    """All values finite, on the host: skip every count the range rules out."""
    n = xf.numel()
    mean = total / n
    # two passes (centre, then norm) rather than torch.var_mean, whose Welford loop is ~20x slower on CPU
    spread = torch.linalg.vector_norm(xf - mean).item()
    var = spread * spread / max(n - 1, 1)
    lo, hi = (v.item() for v in torch.aminmax(xf))
    absmax = max(-lo, hi)
    zeros = underflow = unsafe = overflow = 0
    absx = xf.abs() if absmax >= BF16_UNSAFE or (lo < FP16_MIN_SUBNORMAL and hi > -FP16_MIN_SUBNORMAL) else None
    if absx is not None and absmax >= BF16_UNSAFE:
        unsafe = int((absx >= BF16_UNSAFE).sum().item())
        overflow = int((absx > FP16_MAX).sum().item()) if absmax > FP16_MAX else 0
    if absx is not None and absx.amin().item() < FP16_MIN_SUBNORMAL:
        zeros = int((absx == 0).sum().item())
        underflow = int((absx < FP16_MIN_SUBNORMAL).sum().item()) - zeros
    l2 = torch.linalg.vector_norm(xf).item()
    values = [n, mean, math.sqrt(var), absmax, lo, hi, l2,
              0.0, 0.0, zeros / n, overflow / n, underflow / n, unsafe / n]
    return torch.tensor(values, dtype=torch.float64)


def _summarize_masked(xf: torch.Tensor) -> torch.Tensor:
    """Every statistic over the finite values only, with tensor ops alone (no host synchronisation)."""
    n = xf.numel()
    finite = torch.isfinite(xf)
    xz = torch.nan_to_num(xf, nan=0.0, posinf=0.0, neginf=0.0)
    absz = xz.abs()
    counts = torch.stack([
        finite.sum(),
        torch.isnan(xf).sum(),
        (absz == 0).sum(),  # includes the zeroed non-finite values
        (absz < FP16_MIN_SUBNORMAL).sum(),  # includes every zero
        (absz >= BF16_UNSAFE).sum(),
        (absz > FP16_MAX).sum(),
    ]).to(torch.float64)
    n_finite, n_nan = counts[0], counts[1]
    n_nonfinite = n - n_finite
    var_z, mean_z = (v.to(torch.float64) for v in torch.var_mean(xz, correction=0))
    # From the n zero-filled values to the finite ones: shift the centre to the finite mean, then
    # drop the k = n - n_finite zeros' squared distances to it.
    mean = mean_z * n / n_finite.clamp_min(1.0)
    m2 = n * var_z + n * (mean_z - mean) ** 2 - n_nonfinite * mean**2
    var = (m2 / (n_finite - 1).clamp_min(1.0)).clamp_min(0.0)
    lo, hi = torch.aminmax(torch.where(finite, xf, mean.to(xf.dtype)))  # the mean lies in the finite range
    no_finite = n_finite == 0
    lo = torch.where(no_finite, math.inf, lo.to(torch.float64))
    hi = torch.where(no_finite, -math.inf, hi.to(torch.float64))
    l2 = torch.linalg.vector_norm(xz).to(torch.float64)
    head = torch.stack([torch.full_like(mean, n), mean, var.sqrt(), absz.amax().to(torch.float64), lo, hi, l2])
    zeros = counts[2] - n_nonfinite
    fractions = torch.stack([n_nan, n_nonfinite - n_nan, zeros, counts[5], counts[3] - counts[2], counts[4]]) / n
    return torch.cat([head, fractions])


def stats_dict(summary: torch.Tensor | list[float]) -> dict[str, float]:
    """Name each entry of a summary vector (``numel`` as an int); ``lo``/``hi`` of no finite value are NaN."""
    values = summary.tolist() if isinstance(summary, torch.Tensor) else list(summary)
    out = dict(zip(STAT_NAMES, values))
    out["numel"] = int(out["numel"])
    for key in ("min", "max"):  # +-inf here only means "no finite value"
        if math.isinf(out[key]):
            out[key] = math.nan
    return out


def _signs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed pseudo-random +-1 vectors: one per bucket (column) and one per row (period ``_ROW_PERIOD``)."""
    if device not in _SIGNS:
        gen = torch.Generator().manual_seed(0x5EED)
        col, row = (torch.randint(0, 2, (size,), generator=gen).to(torch.float64) * 2 - 1
                    for size in (SKETCH_SIZE, _ROW_PERIOD))
        _SIGNS[device] = (col.to(device), row.to(device))
    return _SIGNS[device]


@torch.no_grad()
def sketch(x: torch.Tensor) -> torch.Tensor:
    """A ``SKETCH_SIZE`` float64 count-sketch of ``x`` (non-finite values as zero), on ``x``'s device.

    Viewed as rows of ``SKETCH_SIZE``, element ``(r, c)`` is added into bucket ``c`` with the sign
    ``row_sign[r] * col_sign[c]`` (fixed pseudo-random +-1); the signed sum over rows is one matrix-vector
    product. The sketch is linear, so ``sketch(a) - sketch(b) == sketch(a - b)`` up to float64
    rounding, and ``||sketch(d)||^2`` is an unbiased estimate of ``||d||^2``: elements sharing a bucket
    lie in different rows, whose independent signs cancel the cross terms in expectation, leaving a
    relative spread of about ``sqrt(2 / SKETCH_SIZE)`` (4%). Identical tensors give bit-identical
    sketches, so "no divergence" is an exact zero, not a small number.
    """
    flat = torch.nan_to_num(x.detach().reshape(-1).to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    col, row = _signs(flat.device)
    n = flat.numel()
    full, rest = divmod(n, SKETCH_SIZE)
    rows_needed = full + (1 if rest else 0)
    if rows_needed > _ROW_PERIOD:
        row = row.repeat(-(-rows_needed // _ROW_PERIOD))
    out = row[:full] @ flat[: full * SKETCH_SIZE].view(full, SKETCH_SIZE) if full else torch.zeros_like(col)
    if rest:
        out = out + F.pad(flat[full * SKETCH_SIZE:] * row[full], (0, SKETCH_SIZE - rest))
    return out * col


@torch.no_grad()
def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||a||`` in float64 over the finite values, ``inf`` where NaN/Inf patterns differ.

    Two tensors that are NaN (or Inf of the same sign) at the same places agree there: that is a
    property both runs share, not a divergence. ``||a|| == 0`` gives 0 when ``b`` is zero too, else inf.
    """
    if a.shape != b.shape:
        return math.inf
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    fa, fb = torch.isfinite(a64), torch.isfinite(b64)
    if not torch.equal(fa, fb):
        return math.inf
    if not fa.all():
        same = torch.isnan(a64) == torch.isnan(b64)
        same &= torch.where(torch.isinf(a64), a64 == b64, torch.ones_like(fa))
        if not same.all():
            return math.inf
    zero = torch.zeros((), dtype=torch.float64, device=a64.device)
    diff = torch.linalg.vector_norm(torch.where(fa, a64 - b64, zero)).item()
    norm = torch.linalg.vector_norm(torch.where(fa, a64, zero)).item()
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm
