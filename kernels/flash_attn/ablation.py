"""The flash_attn plugin: a tiled online-softmax Triton kernel vs eager math attention.

Read this file with ``microscope/api.py`` to write a plugin of your own: it declares the variants
(baseline, candidate, peers), the case grid, seeded inputs, tolerances, and FLOP/byte counts. The
harness does the rest (seeding, timing, memory, statistics, reports).

Case parameters: ``batch``, ``heads``, ``seq`` (query length), ``kv_prefix`` (keys before the first
query: chunked prefill, so the key length is ``seq + kv_prefix``), ``head_dim``, ``dtype``, ``causal``.
"""

from __future__ import annotations

import functools

import torch
from microscope_kernels.attention_inputs import ATTENTION_TOLERANCE, require_compiled, truth_rows

from microscope.api import (
    Ablation,
    Arm,
    Case,
    Role,
    baseline,
    call_as_timed,
    candidate,
    grid,
    peer,
    randn,
    register,
    warm_ways,
)

from .kernel import SUPPORTED_HEAD_DIMS, flash_attention
from .kernel import precompile as compile_candidates
from .peers import PEERS, Peer
from .reference import eager_attention


def _shapes(case: Case) -> tuple[tuple[int, ...], tuple[int, ...]]:
    b, h, d = case["batch"], case["heads"], case["head_dim"]
    return (b, h, case["seq"], d), (b, h, case["seq"] + case["kv_prefix"], d)


def peer_variant(p: Peer, description: str):
    """A peer variant whose ``supports`` asks the backend's own rule (dtype, head dim, device...)."""

    def supports(case: Case, device: str) -> str | None:
        q_shape, k_shape = _shapes(case)
        return p.supports(q_shape, k_shape, case.dtype, device, case["causal"])

    return peer(p.fn, description, supports=supports)


def triton_supports(case: Case, device: str) -> str | None:
    if case["head_dim"] not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {case['head_dim']} not in {SUPPORTED_HEAD_DIMS}"
    return None


#: The forward stages a ``--profile stages`` run leaves out one at a time (``kernel.OMIT_STAGES``).
STAGES = {"softmax": "the softmax (max, exponentials, rescale, row sums, mask)",
          "exp2": "the exponentials alone", "pv": "the PV GEMM and V's loads"}


def _stage_peer(stage: str):
    """The kernel at its own configuration with one forward stage left out: wrong by design, so speed only,
    forward only, and only where a config names it (what the stage costs is the time it takes off)."""
    return peer(functools.partial(flash_attention, omit=stage), f"microscope's kernel without {STAGES[stage]}: "
                "a stage study, speed only", needs=("triton",), supports=triton_supports, checked=False,
                differentiable=False, opt_in=True)


def _warm_compiled_peer(case: Case, device: str, backward: bool) -> None:
    """One call of the torch.compile'd flex_attention peer at the case's shapes, forward only or with its
    backward, so that graph's kernels are in the inductor cache on disk before the run's first call (a
    cache hit there still traces)."""
    flex = PEERS["flex"]
    q_shape, k_shape = _shapes(case)
    if flex.supports(q_shape, k_shape, case.dtype, device, case["causal"]) is not None:
        return
    q, k, v = (torch.zeros(s, device=device, dtype=case.dtype) for s in (q_shape, k_shape, k_shape))
    call_as_timed(flex.fn, {"q": q, "k": k, "v": v, "causal": case["causal"]}, ("q", "k", "v") if backward else ())
    torch.cuda.synchronize()


def use_flash_attention(model) -> None:  # noqa: ANN001 - a microscope.api.Transformer
    """Model level: every block of the embedded model calls the Triton kernel as its ``attn_fn``.

    ``flash_attention(q, k, v, causal)`` already has the workload's attention contract (q, k, v as
    (B, H, S, D); causal only with equal lengths; default scale 1/sqrt(D), as the eager baseline).
    """
    model.set_attention(flash_attention)


@register("flash_attn")
class FlashAttention(Ablation):
    """Tiled online-softmax attention in one Triton kernel (forward and backward) vs eager math attention."""

    variants = {
        "eager": baseline(eager_attention, "matmul, mask, softmax, matmul in plain PyTorch"),
        "triton": candidate(flash_attention, "microscope's FlashAttention-2 style Triton kernel",
                            needs=("triton",), supports=triton_supports,
                            params={"loads": "auto", "dq": "separate", "split": False}),
        "sdpa_math": peer_variant(PEERS["sdpa_math"], "torch SDPA, math backend"),
        "sdpa_flash": peer_variant(PEERS["sdpa_flash"], "torch SDPA, FlashAttention-2 backend"),
        "sdpa_cudnn": peer_variant(PEERS["sdpa_cudnn"], "torch SDPA, cuDNN backend"),
        "sdpa_efficient": peer_variant(PEERS["sdpa_efficient"], "torch SDPA, memory-efficient backend"),
        "flex": peer_variant(PEERS["flex"], "torch flex_attention, compiled (Triton)"),
        **{f"triton_no_{stage}": _stage_peer(stage) for stage in STAGES},
    }
    cases = grid(batch=[1], heads=[2], seq=[100], kv_prefix=[0], head_dim=[64], dtype=["fp32", "bf16"],
                 causal=[False, True])
    #: Model level: the workload's own eager attention vs the kernel patched into every block.
    arms = {
        "eager": Arm(Role.BASELINE, "the embedded model's eager attention (scores, mask, softmax, matmul)"),
        "triton": Arm(description="microscope's FlashAttention-2 style Triton kernel in every block",
                      patch=use_flash_attention, needs=("triton",)),
    }
    tolerance = ATTENTION_TOLERANCE

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        q_shape, k_shape = _shapes(case)
        return {
            "q": randn(q_shape, case.dtype, gen, device),
            "k": randn(k_shape, case.dtype, gen, device),
            "v": randn(k_shape, case.dtype, gen, device),
            "causal": case["causal"],
        }

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("q", "k", "v")

    def reference(self, inputs) -> torch.Tensor:  # noqa: ANN001 - the inputs mapping, in float64
        """The eager baseline on the float64 copies, a slice of query rows at a time, so that a 16k-token
        case's truth fits beside the timed variants on an 80 GB card (at once it holds 64 GiB of scores)."""
        return eager_attention(**inputs, rows_per_step=truth_rows(inputs["q"], inputs["k"]))

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the kernel's autotuning candidates for the case's dtype, head dim, mask and
        tiling (one batch and head: the binaries do not depend on them)."""
        if device != "cuda" or triton_supports(case, device):
            return
        (_, _, sq, d), (_, _, sk, _) = _shapes(case)
        q = torch.zeros((1, 1, sq, d), device=device, dtype=case.dtype)
        k = torch.zeros((1, 1, sk, d), device=device, dtype=case.dtype)
        for grads in warm_ways(shard, backward):  # torch.compile's own cache, one graph per way the run calls it
            _warm_compiled_peer(case, device, grads)
        after = ((shard[0] - 1) % shard[1], shard[1])  # the candidates start one process on, away from the warm-up
        failed = compile_candidates(q, k, case["causal"], backward=backward, shard=after)
        require_compiled(failed)

    def flops(self, case: Case, backward: bool = False) -> float:
        """4*B*H*D per visible (query, key) pair: QK^T and PV, 2 FLOPs per multiply-add.

        Causal counts the pairs actually visible (bottom-right aligned), not a flat half. The backward
        does 2.5x the forward's matmul work (dV, dP, dQ, dK), so forward+backward is 3.5x.
        """
        sq, sk = case["seq"], case["seq"] + case["kv_prefix"]
        if case["causal"]:
            offset = sk - sq
            pairs = sum(min(sk, i + 1 + offset) for i in range(sq))
        else:
            pairs = sq * sk
        fwd = 4.0 * case["batch"] * case["heads"] * pairs * case["head_dim"]
        return fwd * 3.5 if backward else fwd

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Forward: read Q, K, V, write O. Backward adds: read Q, K, V, O, dO, write dQ, dK, dV."""
        itemsize = case.dtype.itemsize
        b, h, d = case["batch"], case["heads"], case["head_dim"]
        sq, sk = case["seq"], case["seq"] + case["kv_prefix"]
        fwd = itemsize * b * h * d * (2 * sq + 2 * sk)
        bwd = itemsize * b * h * d * (4 * sq + 2 * sk) + itemsize * b * h * d * (sq + 2 * sk)
        return fwd + bwd if backward else fwd
