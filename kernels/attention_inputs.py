"""What the attention rooms (flash_attn and the catalogue's sliding-window, LSH, linear and axial rooms) hold
in common: the output tolerance of an fp32-accumulating attention, the checks of q, k, v's layout, and
their precompile steps' helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from microscope_kernels.input_checks import FLOAT_DTYPES

from microscope.api import Ablation, Case, Tolerance, call_as_timed

#: Per dtype: the output and gradient rule of an attention that accumulates in fp32 (``ref_factor``: at
#: most 4x the eager baseline's own error against the float64 truth).
ATTENTION_TOLERANCE = {
    "fp32": Tolerance(rtol=1e-3, atol=1e-5, ref_factor=4),
    "fp16": Tolerance(rtol=2e-2, atol=2e-3, ref_factor=4, max_mismatch=1e-3),
    "bf16": Tolerance(rtol=6e-2, atol=1e-2, ref_factor=4, max_mismatch=1e-3),
}
#: float64 scores a chunked ground truth holds per step (1 GiB): a long case's truth fits beside the variants'
#: buffers, where the plain baseline on float64 copies would hold B*H*Sq*Sk scores (and their softmax) at once.
TRUTH_SCORES = 1 << 27


def truth_rows(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query rows per step of a chunked ground truth for q (B, H, Sq, D) and k (B, H, Sk, D): ``TRUTH_SCORES``
    scores at a time."""
    return max(1, TRUTH_SCORES // max(1, q.shape[0] * q.shape[1] * k.shape[-2]))


def gpu_memory_refusal(need: int, device: str, share: float, what: str) -> str | None:
    """A ``supports`` answer for a variant that holds ``need`` bytes at once (``what`` names them): None on a
    CPU or where they fit in ``share`` of the GPU memory available now (free, plus what PyTorch's allocator
    holds unused), else the reason the case is skipped, so a smaller card skips it instead of failing."""
    if torch.device(device).type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    available = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if need <= share * available:
        return None
    return (f"{what} would hold {need / 2**30:.1f} GiB, more than {share:.0%} of the {available / 2**30:.1f} GiB "
            "of GPU memory available")


def check_qkv(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dims: Sequence[int]) -> None:
    """q (B, H, Sq, D) and k, v (B, H, Sk, D) of one fp32/fp16/bf16 dtype on one device, D in ``head_dims``."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name} expects (B, H, S, D) tensors, got q{tuple(q.shape)} k{tuple(k.shape)} "
                         f"v{tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, Sq, D) and k, v (B, H, Sk, D) disagree: q{tuple(q.shape)} k{tuple(k.shape)} "
                         f"v{tuple(v.shape)}")
    if q.shape[3] not in head_dims:
        raise ValueError(f"{name} supports head dims {tuple(head_dims)}, got {q.shape[3]}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} needs q, k, v of one dtype among fp32/fp16/bf16, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")


def require_compiled(failed: Sequence[tuple[str, str, str]]) -> None:
    """Raise on the (kernel, config, error) candidates a precompile step could not compile: the run reports
    the first, and compiles the rest on first use."""
    if failed:
        kernel, config, error = failed[0]
        raise RuntimeError(f"{len(failed)} candidate(s) did not compile, first {kernel} {config}: {error}")


def warm_short_call(plugin: Ablation, case: Case, fn: Callable[..., object], seq: int, device: str,
                    backward: bool) -> None:
    """One call of ``fn`` (with its backward where ``backward``) on ``case`` cut to batch 1, one head and
    ``seq`` tokens: it builds the binaries of the case itself for kernels whose lengths are not specialized."""
    short = Case.of(**{**case.params, "batch": 1, "heads": 1, "seq": seq})
    inputs = plugin.inputs(short, torch.Generator().manual_seed(0), device)
    call_as_timed(fn, inputs, plugin.grad_inputs(short) if backward else ())
    torch.cuda.synchronize()
