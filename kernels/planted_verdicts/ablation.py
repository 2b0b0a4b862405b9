"""planted_verdicts: attention variants that are slower, wrong, or cheat the timer, by a known amount.

Not an optimization: a calibration target for the verdict layer (headline, exit code, best-peer rows).
Each candidate is eager causal attention changed in one known way: an A/A copy, 3/5/10% more work,
an all-zeros or constant-rows output, a causal mask that lets each query see one future key, a 1e-3
relative drift, and a variant that memoizes its first answer. A wrong candidate must never be called
faster or smaller, a planted slowdown must be called slower, and the A/A copy must not be called
different.
"""

from __future__ import annotations

import math

import torch

from microscope.api import Ablation, Case, Tolerance, baseline, candidate, grid, peer, randn, register


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """Causal ``softmax(q k^T / sqrt(D)) v``; query i sees keys j < i + shift (shift 1 is the right mask).

    Memory traffic per head: reads 2*S*D, writes S*S (scores); the mask and the softmax read and write
    S*S each; the second product reads S*S + S*D and writes S*D.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = q.shape[-2]
    hidden = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(diagonal=shift)
    return torch.matmul(torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1), v)


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eager causal attention."""
    return _attention(q, k, v)


def aa_copy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The baseline's code under another name (an A/A comparison)."""
    return _attention(q, k, v)


def _more_work(percent: int):
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = _attention(q, k, v)
        heads = q.shape[0] * q.shape[1]
        extra = round(heads * percent / 100)
        flat = (t.reshape(heads, *t.shape[2:]) for t in (q, k, v))
        _attention(*(t[:extra] for t in flat))  # recomputed and thrown away: planted work
        return out

    run.__doc__ = f"The baseline plus {percent}% of its heads computed twice."
    return run


def zeros(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Wrong: all zeros (fast and useless)."""
    return torch.zeros_like(q)


def constant_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Wrong: every query gets the mean of the values (each row constant across queries)."""
    return v.mean(dim=-2, keepdim=True).expand_as(q).contiguous()


def mask_off_by_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Wrong: the causal mask lets each query see one future key."""
    return _attention(q, k, v, shift=2)


def drift(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Slightly wrong: the right answer times (1 + 1e-3)."""
    return _attention(q, k, v) * (1 + 1e-3)


_FIRST: dict[tuple, torch.Tensor] = {}


def memo(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Cheats the timer: at inference it returns its first answer for this shape, whatever the inputs."""
    if torch.is_grad_enabled():
        return _attention(q, k, v)
    key = (tuple(q.shape), q.dtype, q.device)
    if key not in _FIRST:
        _FIRST[key] = _attention(q, k, v)
    return _FIRST[key]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's scaled_dot_product_attention (whichever backend it picks)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@register("planted_verdicts")
class PlantedVerdicts(Ablation):
    """Calibration: attention candidates that are slower, wrong or cheating by a known amount."""

    variants = {
        "eager": baseline(eager),
        "aa_copy": candidate(aa_copy),
        **{f"slower_{p}pct": candidate(_more_work(p)) for p in (3, 5, 10)},
        "zeros": candidate(zeros),
        "constant_rows": candidate(constant_rows),
        "mask_off_by_one": candidate(mask_off_by_one),
        "drift_1e-3": candidate(drift),
        "memo": candidate(memo),
        "sdpa": peer(sdpa),
    }
    # batch x heads = 100, so a planted percentage is a whole number of heads
    cases = grid(batch=[4], heads=[25], seq=[128], head_dim=[64], dtype=["fp32", "bf16"])
    tolerance = {"fp32": Tolerance(rtol=1e-5, atol=1e-6), "bf16": Tolerance(rtol=2e-2, atol=1e-2, max_mismatch=0.01)}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        return {name: randn(shape, case.dtype, gen, device) for name in ("q", "k", "v")}

    def flops(self, case: Case, backward: bool = False) -> float:
        visible = case["seq"] * (case["seq"] + 1) / 2  # causal: query i sees i + 1 keys
        return 4.0 * case["batch"] * case["heads"] * visible * case["head_dim"] * (3.5 if backward else 1.0)

    def bytes(self, case: Case, backward: bool = False) -> float:
        return 4.0 * case["batch"] * case["heads"] * case["seq"] * case["head_dim"] * case.dtype.itemsize
