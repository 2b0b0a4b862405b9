"""The linear_attention plugin: Performer and cosFormer linear attention through a chunked Triton kernel,
against the same feature maps with the quadratic form in plain PyTorch (GitHub issue #24).

Case parameters: ``batch``, ``heads``, ``seq`` (queries = keys), ``head_dim``, ``features`` (F: Performer's
random features; cosFormer's are always ``2 * head_dim``, its cos and sin halves), ``feature_map``
(``performer`` | ``cosformer``), ``causal``, ``chunk`` (the kernel's C), ``dtype``.

Peers: exact softmax attention (SDPA's flash backend, microscope's FlashAttention-2 kernel) on the same
q, k, v. Different math, so they are speed-only peers (``checked=False``); the ``bench`` profile sweeps the
sequence length, so the table's ``triton/best peer`` column shows where the linear kernel overtakes
FlashAttention (``peers.py``). The eager baseline materializes (S x S) matrices: on a GPU it refuses a case
whose matrices would not fit (``quadratic_bytes``), which records it as skipped rather than failed.

Model level: the embedded causal LM trained with Performer or cosFormer attention in every block against
its softmax attention (``model.py``); Linformer cannot be an arm of a causal LM (README).
"""

from __future__ import annotations

import functools

import torch
from microscope_kernels.attention_inputs import (
    ATTENTION_TOLERANCE,
    gpu_memory_refusal,
    require_compiled,
    truth_rows,
    warm_short_call,
)
from microscope_kernels.flash_attn.kernel import precompile as flash_precompile

from microscope.api import Ablation, Arm, Case, Role, baseline, candidate, grid, peer, randn, register

from .attention import eager_linear_attention, triton_linear_attention
from .features import FEATURE_MAPS, orthogonal_projection
from .kernel import SUPPORTED_CHUNKS, SUPPORTED_DIMS
from .model import use_cosformer, use_flash, use_performer
from .peers import flash_attn_softmax, sdpa_flash_softmax, softmax_supports

#: The share of the GPU memory available at a case's start that the eager form's forward (S x S) matrices may
#: take: its backward holds gradients of the same size, and the allocator needs slack.
QUADRATIC_SHARE = 2 / 3


def _positive_int(case: Case, name: str) -> int:
    value = case[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"case parameter {name} must be a positive integer, got {value!r}")
    return value


def check_case(case: Case) -> None:
    """Every case parameter, with a message that names the fix (a bad config value is not a traceback)."""
    for name in ("batch", "heads", "seq", "head_dim", "features", "chunk"):
        _positive_int(case, name)
    if case["feature_map"] not in FEATURE_MAPS:
        raise ValueError(f"case parameter feature_map must be one of {FEATURE_MAPS}, got {case['feature_map']!r}")
    if not isinstance(case["causal"], bool):
        raise ValueError(f"case parameter causal must be true or false, got {case['causal']!r}")
    if case["feature_map"] == "cosformer" and case["features"] != 2 * case["head_dim"]:
        raise ValueError(f"cosformer has 2 * head_dim features (ReLU features times cos and sin): set features "
                         f"{2 * case['head_dim']} for head_dim {case['head_dim']}, not {case['features']}")
    if case["chunk"] not in SUPPORTED_CHUNKS:
        raise ValueError(f"case parameter chunk must be one of {SUPPORTED_CHUNKS}, got {case['chunk']!r}")


def _triton_supports(case: Case, device: str) -> str | None:
    for name in ("head_dim", "features"):
        if case[name] not in SUPPORTED_DIMS:
            return f"{name} {case[name]} not in {SUPPORTED_DIMS}"
    return None


def quadratic_bytes(case: Case) -> int:
    """Bytes of the (B, H, S, S) matrices ``linear_attention_reference`` holds at once in its forward: A =
    phi(q) phi(k)^T and its masked or re-weighted copy; Performer adds the float32 re-weighting exponent and,
    below fp32, its cast to A's dtype. (The (S, S) causal mask, without B and H, is left to the margin.)"""
    item = case.dtype.itemsize
    if case["feature_map"] == "performer":
        per_score = 2 * item + 4 + (item if item != 4 else 0)
    else:
        per_score = 2 * item if case["causal"] else item
    return case["batch"] * case["heads"] * case["seq"] ** 2 * per_score


def _eager_supports(case: Case, device: str) -> str | None:
    """Refuse, on a GPU only, a case whose forward (S x S) matrices would take more than ``QUADRATIC_SHARE``
    of the memory available now (free, plus what PyTorch's allocator holds unused)."""
    if torch.device(device).type != "cuda":
        return None
    try:
        check_case(case)
    except ValueError:
        return None  # inputs() fails the case with the reason
    return gpu_memory_refusal(quadratic_bytes(case), device, QUADRATIC_SHARE,
                              "the quadratic form's (S x S) matrices")


def linear_form_flops(batch: int, heads: int, seq: int, head_dim: int, features: int, feature_map: str,
                      backward: bool = False) -> float:
    """FLOPs the linear form needs, causal or not: ``phi(K)^T V`` and ``phi(Q) S`` (2·S·F·D each), the
    normalizer (2·S·F each), and Performer's two projections (2·S·D·F each; cosFormer's map is elementwise).

    The chunked kernel's masked (C x C) intra-chunk products (about 2·S·C·(F + D) more, half of them masked
    out) are not counted: TFLOP/s is the work the math asks for. The backward needs twice the linear form's
    forward (dQ, dK, dV and the reverse state) and once the projections' (their input gradients).
    """
    lin = batch * heads * (4.0 * seq * features * head_dim + 4.0 * seq * features)
    feat = 4.0 * batch * heads * seq * head_dim * features if feature_map == "performer" else 0.0
    return 3 * lin + 2 * feat if backward else lin + feat


@register("linear_attention")
class LinearAttention(Ablation):
    """Performer / cosFormer linear attention in a chunked Triton kernel vs the quadratic form in PyTorch."""

    variants = {
        "eager": baseline(eager_linear_attention, "feature map, then phi(q) phi(k)^T materialized, masked, "
                                                  "normalized, in plain PyTorch", supports=_eager_supports),
        "triton": candidate(triton_linear_attention, "feature map, then the chunked Triton kernel (fp32 states)",
                            needs=("triton",), supports=_triton_supports),
        "sdpa_flash": peer(sdpa_flash_softmax, "exact softmax attention, SDPA FlashAttention-2 backend "
                                               "(different math: speed only)", supports=softmax_supports("sdpa_flash"),
                           checked=False),
        "flash_attn": peer(flash_attn_softmax, "exact softmax attention, microscope's FlashAttention-2 Triton kernel "
                                               "(different math: speed only)",
                           needs=("triton",), supports=softmax_supports("flash_attn"), checked=False),
    }
    cases = grid(batch=[1], heads=[2], seq=[100], head_dim=[32], features=[64],
                 feature_map=["performer", "cosformer"], causal=[False, True], chunk=[32], dtype=["fp32", "bf16"])
    #: Model level: softmax attention vs Performer and cosFormer in every block of the embedded causal LM.
    arms = {
        "softmax": Arm(Role.BASELINE, "the embedded model's eager softmax attention in every block"),
        "performer": Arm(description="FAVOR+ (2 x head_dim orthogonal random features) through the chunked kernel "
                                     "in every block", patch=use_performer, needs=("triton",)),
        "cosformer": Arm(description="cosFormer (ReLU features, cos re-weighting) through the chunked kernel in "
                                     "every block", patch=use_cosformer, needs=("triton",)),
        # the two arms above with the causal sums in plain PyTorch (the reference's quadratic form): the same
        # function, trainable for hundreds of steps on a CPU (``--profile trained``)
        "performer_eager": Arm(description="performer, computed by the eager reference",
                               patch=functools.partial(use_performer, eager=True)),
        "cosformer_eager": Arm(description="cosformer, computed by the eager reference",
                               patch=functools.partial(use_cosformer, eager=True)),
        "flash": Arm(Role.PEER, "exact softmax attention through flash_attn's FA2 Triton kernel in every block: "
                                "the fused softmax comparator for speed and memory", patch=use_flash,
                     needs=("triton",)),
    }
    tolerance = ATTENTION_TOLERANCE

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """In the last shard, the chunked kernels of the case (one call, with its backward where the run
        times gradients, on a two-chunk sequence: their lengths are not specialized, so the binaries are the
        case's own); in every shard, its part of flash_attn's autotuning candidates at the case's length, for
        the flash_attn peer (each new length autotunes every candidate)."""
        if device != "cuda":
            return
        if shard[0] == shard[1] - 1 and _triton_supports(case, device) is None:
            warm_short_call(self, case, triton_linear_attention, min(case["seq"], 2 * case["chunk"]), device, backward)
        if softmax_supports("flash_attn")(case, device) is None:
            x = torch.zeros((1, 1, case["seq"], case["head_dim"]), device=device, dtype=case.dtype)
            failed = flash_precompile(x, x, bool(case["causal"]), backward=backward, shard=shard)
            require_compiled(failed)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        check_case(case)
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        out: dict[str, object] = {name: randn(shape, case.dtype, gen, device) for name in ("q", "k", "v")}
        if case["feature_map"] == "performer":
            out["projection"] = orthogonal_projection(case["features"], case["head_dim"], gen, device)
        out.update(feature_map=case["feature_map"], causal=case["causal"], chunk=case["chunk"])
        return out

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("q", "k", "v")

    def reference(self, inputs) -> torch.Tensor:  # noqa: ANN001 - the inputs mapping, in float64
        """The baseline's math on float64 copies, a slice of query rows at a time, so that the float64
        (rows, Sk) matrices of a 16k-token case fit beside the variants."""
        return eager_linear_attention(**inputs, rows_per_step=truth_rows(inputs["q"], inputs["k"]))

    def flops(self, case: Case, backward: bool = False) -> float:
        """``linear_form_flops`` of the case: the same count for every variant, so in the bench table a
        softmax peer's "TFLOP/s" is the linear form's work over the peer's time and the ratio column is a
        latency ratio."""
        return linear_form_flops(case["batch"], case["heads"], case["seq"], case["head_dim"], case["features"],
                                 case["feature_map"], backward)

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Forward: read Q, K, V (and Performer's F x D float32 projection), write O. Backward adds: read Q, K,
        V, O, dO, write dQ, dK, dV."""
        elems = case["batch"] * case["heads"] * case["seq"] * case["head_dim"]
        itemsize = case.dtype.itemsize
        proj = 4 * case["features"] * case["head_dim"] if case["feature_map"] == "performer" else 0
        fwd = 4 * elems * itemsize + proj
        return fwd + 8 * elems * itemsize if backward else fwd
