"""The axial_attention plugin: attention factored over the rows and columns of a 2-D layout, through
flash_attn's Triton kernel, against the same axial attention in eager PyTorch (GitHub issue #24, claim
"320 ms -> 110 ms").

Case parameters: ``batch``, ``heads``, ``rows``, ``cols`` (the sequence is ``rows * cols`` tokens, row-major),
``head_dim``, ``causal`` (both passes causal along their axis), ``dtype``. ``grid.py`` defines the operator.

Accuracy compares axial variants with the float64 axial reference only. The claim is about speed against
full attention, which is different math: the full-attention peers (``sdpa_full``, ``flash_full``) are
speed-only peers (``checked=False``: timed in the same rounds, accuracy skipped).
"""

from __future__ import annotations

import torch
from microscope_kernels.attention_inputs import ATTENTION_TOLERANCE, require_compiled
from microscope_kernels.flash_attn.kernel import precompile as flash_precompile

from microscope.api import Ablation, Case, baseline, candidate, grid, peer, randn, register

from .grid import check_grid
from .kernel import SUPPORTED_HEAD_DIMS, axial_attention
from .peers import flash_full, sdpa_axial, sdpa_full
from .reference import axial_attention_reference


def _shape(case: Case) -> tuple[int, int, int, int]:
    """(B, H, S, D) of the case, with every parameter checked (a clear message for a bad config value)."""
    for name in ("batch", "heads", "head_dim"):
        value = case[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"case parameter {name} must be a positive integer, got {value!r}")
    rows, cols = case["rows"], case["cols"]
    check_grid(rows * cols if isinstance(rows, int) and isinstance(cols, int) else -1, rows, cols)
    return case["batch"], case["heads"], rows * cols, case["head_dim"]


def _flash_supports(case: Case, device: str) -> str | None:
    if case["head_dim"] not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {case['head_dim']} not in {SUPPORTED_HEAD_DIMS}"
    return None


def _pairs(rows: int, cols: int, causal: bool) -> int:
    """Scored (query, key) pairs of both passes: each token scores its row and its column (causal: the part
    up to itself)."""
    if causal:
        return rows * cols * (cols + 1) // 2 + cols * rows * (rows + 1) // 2
    return rows * cols * (rows + cols)


@register("axial_attention")
class AxialAttention(Ablation):
    """Axial (row, then column) attention through flash_attn's Triton kernel vs the same in eager PyTorch."""

    variants = {
        "eager": baseline(axial_attention_reference, "axial attention, eager matmul-softmax-matmul per pass"),
        "triton": candidate(axial_attention, "flash_attn's FA2 Triton kernel on the row and column batches",
                            needs=("triton",), supports=_flash_supports),
        "sdpa_axial": peer(sdpa_axial, "axial attention with torch SDPA in both passes (same math)"),
        "sdpa_full": peer(sdpa_full, "torch SDPA full attention over rows*cols tokens: different math, speed only",
                          checked=False),
        "flash_full": peer(flash_full, "flash_attn's kernel, full attention over rows*cols tokens: different math, "
                                       "speed only", needs=("triton",), supports=_flash_supports, checked=False),
    }
    cases = grid(batch=[1], heads=[2], rows=[7], cols=[9], head_dim=[64], causal=[False, True],
                 dtype=["fp32", "bf16"])
    tolerance = ATTENTION_TOLERANCE

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        shape = _shape(case)
        return {
            "q": randn(shape, case.dtype, gen, device),
            "k": randn(shape, case.dtype, gen, device),
            "v": randn(shape, case.dtype, gen, device),
            "rows": case["rows"],
            "cols": case["cols"],
            "causal": bool(case["causal"]),
        }

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("q", "k", "v")

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of flash_attn's autotuning candidates at the row pass's, the column pass's and (in one
        shard per case, for the flash_full peer) the full sequence's shapes."""
        if device != "cuda" or _flash_supports(case, device):
            return
        _, _, seq, head_dim = _shape(case)
        # the passes' lengths split over every process; the full length's candidates all in shard 0
        lengths = {case["cols"]: shard, case["rows"]: shard}
        if shard[0] == 0:
            lengths.setdefault(seq, (0, 1))
        failed = []
        for length, part in lengths.items():
            x = torch.zeros((1, 1, length, head_dim), device=device, dtype=case.dtype)
            failed += flash_precompile(x, x, bool(case["causal"]), backward=backward, shard=part)
        require_compiled(failed)

    def flops(self, case: Case, backward: bool = False) -> float:
        """4*B*H*D per scored (query, key) pair of the two passes (QK^T and PV, 2 FLOPs per multiply-add):
        ``S * (rows + cols)`` pairs, or the causal half of each pass; full attention scores ``S^2``. The
        backward does 2.5x the forward's matmul work. Applied to the full-attention peers, TFLOP/s reads as an
        axial-equivalent rate (the same count over their time): compare their latencies."""
        b, h, _, d = _shape(case)
        fwd = 4.0 * b * h * d * _pairs(case["rows"], case["cols"], bool(case["causal"]))
        return fwd * 3.5 if backward else fwd

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Forward: read Q, K, V, write O. Backward adds: read Q, K, V, O, dO, write dQ, dK, dV. The row
        pass's output (written, then read by the column pass) and the column pass's transposing copies are
        extra traffic a roofline should not credit."""
        b, h, s, d = _shape(case)
        elems = b * h * s * d
        fwd = 4 * elems * case.dtype.itemsize
        return fwd + 8 * elems * case.dtype.itemsize if backward else fwd
