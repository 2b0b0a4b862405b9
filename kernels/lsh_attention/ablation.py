"""The lsh_attention plugin: hash-bucketed (Reformer LSH) attention in one Triton kernel, forward and backward,
against eager attention with the same buckets as a dense mask (GitHub issue #24).

Case parameters: ``batch``, ``heads``, ``seq`` (queries = keys), ``head_dim``, ``n_buckets`` (per round, 1 or
even), ``n_hashes`` (rounds; their rotations are an input tensor drawn from the harness's seeded generator),
``chunk`` (chunk length, or window for the window rule), ``rule`` (``chunk``: Reformer's sorted chunk and the
one before it; ``window``: the causal-safe rule), ``causal``, ``data`` (q and k: ``random`` normal or
``clustered``, ``recall.clustered_qk``), ``dtype``. ``visibility.py`` defines the rules.

Accuracy compares every variant with the same bucketed attention in float64 (an exact-math check with float
tolerances): LSH attention is not meant to equal full attention. How much of full attention it keeps (recall
of the heaviest keys, ``recall.py``) is the plugin's ``figures()``. The full-attention peers (``sdpa_full``,
``flash_full``) compute different math: speed-only peers (``checked=False``), the "speed vs full attention"
comparators.

Model level: the embedded model trained with causal-safe LSH attention (window rule) in every block, against
full attention (``model.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from microscope_kernels.attention_inputs import ATTENTION_TOLERANCE, require_compiled, truth_rows, warm_short_call
from microscope_kernels.flash_attn.kernel import flash_attention
from microscope_kernels.flash_attn.kernel import precompile as flash_precompile

from microscope.api import Ablation, Arm, Case, Figure, Role, baseline, candidate, grid, peer, randn, register

from .hashing import draw_rotations
from .kernel import SUPPORTED_HEAD_DIMS, lsh_attention
from .model import use_lsh_attention
from .peers import FLASH_HEAD_DIMS, flash_full, sdpa_full, sdpa_masked
from .recall import DATA, clustered_qk, recall
from .reference import lsh_attention_reference
from .visibility import LSHSpec, key_intervals, scored_pairs

#: Seed of the representative q, k and rotations ``flops`` counts scored pairs on.
_FLOPS_SEED = 0
#: The recall figure's k: the share of each query's k heaviest keys (under full attention) LSH attention sees.
RECALL_TOP_K = 8
#: The variants that compute full attention over every key.
FULL_ATTENTION = ("sdpa_full", "flash_full")


def _positive(case: Case, name: str) -> int:
    value = case[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"case parameter {name} must be a positive integer, got {value!r}")
    return value


def _spec(case: Case) -> LSHSpec:
    """The case's rule, with every parameter checked (a clear message for a bad config value)."""
    for name in ("batch", "heads", "seq", "head_dim", "n_hashes"):
        _positive(case, name)
    if case["data"] not in DATA:
        raise ValueError(f"case parameter data must be one of {DATA}, got {case['data']!r}")
    return LSHSpec(n_buckets=case["n_buckets"], chunk=case["chunk"], causal=bool(case["causal"]), rule=case["rule"])


def _needs_head_dim(dims: tuple[int, ...]):
    def supports(case: Case, device: str) -> str | None:
        return None if case["head_dim"] in dims else f"head_dim {case['head_dim']} not in {dims}"

    return supports


@functools.lru_cache(maxsize=256)
def _scored_pairs(seq: int, head_dim: int, n_buckets: int, n_hashes: int, chunk: int, rule: str, causal: bool) -> int:
    """Pairs the kernel scores for one head on the representative draw (cached: the harness asks per record)."""
    gen = torch.Generator().manual_seed(_FLOPS_SEED)
    q, k = (torch.randn((1, 1, seq, head_dim), generator=gen) for _ in range(2))
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=causal, rule=rule)
    return scored_pairs(key_intervals(spec, q, k, draw_rotations(n_hashes, head_dim, n_buckets, gen)))


def use_full_flash_attention(model) -> None:  # noqa: ANN001 - a microscope.api.Transformer
    """Full causal attention through flash_attn's fused kernel in every block: the speed and memory of full
    attention without eager's materialized scores."""
    model.set_attention(flash_attention)


@register("lsh_attention")
class LSHAttentionAblation(Ablation):
    """Reformer-style LSH attention in one Triton kernel (forward and backward) vs eager bucket-masked attention."""

    variants = {
        "eager": baseline(lsh_attention_reference, "the same buckets as a dense mask: matmul, masked softmax, matmul"),
        "triton": candidate(lsh_attention, "Triton kernel over each query's interval of bucket-sorted keys",
                            needs=("triton",), supports=_needs_head_dim(SUPPORTED_HEAD_DIMS)),
        "sdpa_masked": peer(sdpa_masked, "torch SDPA with the dense bucket mask (same math)"),
        "sdpa_full": peer(sdpa_full, "torch SDPA full attention over every key: different math, speed only",
                          checked=False),
        "flash_full": peer(flash_full, "flash_attn's FA2 Triton kernel, full attention: different math, speed only",
                           needs=("triton",), supports=_needs_head_dim(FLASH_HEAD_DIMS), checked=False),
    }
    cases = grid(batch=[1], heads=[2], seq=[100], head_dim=[64], n_buckets=[4], n_hashes=[2], chunk=[16],
                 rule=["chunk"], causal=[False, True], data=["random"], dtype=["fp32", "bf16"])
    #: Model level: full attention vs causal-safe LSH attention (``model.py``), in the embedded model.
    arms = {
        "full": Arm(Role.BASELINE, "the embedded model's full (eager) causal attention in every block"),
        "lsh": Arm(description="causal-safe LSH attention (8 buckets, 2 rounds, window context/8) through the "
                               "Triton kernel in every block", patch=use_lsh_attention, needs=("triton",)),
        # the arm above through the eager reference (same buckets and mask): trainable for hundreds of steps on
        # a CPU (``--profile trained``)
        "lsh_eager": Arm(description="lsh, computed by the eager reference",
                         patch=functools.partial(use_lsh_attention, eager=True)),
        "flash_full": Arm(Role.PEER, "full causal attention through flash_attn's FA2 Triton kernel in every block: "
                                     "a fused full-attention comparator for speed and memory",
                          patch=use_full_flash_attention, needs=("triton",)),
    }
    tolerance = ATTENTION_TOLERANCE

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """In the last shard, the LSH kernels of the case (one call, with its backward where the run checks
        gradients, on a short sequence: their integer arguments are not specialized, so the binaries are
        the case's own); in every shard, its part of flash_attn's autotuning candidates at the case's full
        length, for the flash_full peer (its shapes are in no tuned table, so each length autotunes every
        candidate)."""
        if device != "cuda":
            return
        if shard[0] == shard[1] - 1 and case["head_dim"] in SUPPORTED_HEAD_DIMS:
            warm_short_call(self, case, lsh_attention, min(case["seq"], 4 * case["chunk"]), device, backward)
        if case["head_dim"] not in FLASH_HEAD_DIMS:
            return
        x = torch.zeros((1, 1, case["seq"], case["head_dim"]), device=device, dtype=case.dtype)
        failed = flash_precompile(x, x, bool(_spec(case).causal), backward=backward, shard=shard)
        require_compiled(failed)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        spec = _spec(case)
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        if case["data"] == "clustered":
            q, k = clustered_qk(shape, case.dtype, gen, device)
        else:
            q, k = randn(shape, case.dtype, gen, device), randn(shape, case.dtype, gen, device)
        return {
            "q": q,
            "k": k,
            "v": randn(shape, case.dtype, gen, device),
            "rotations": draw_rotations(case["n_hashes"], case["head_dim"], spec.n_buckets, gen, device),
            "n_buckets": spec.n_buckets,
            "chunk": spec.chunk,
            "causal": spec.causal,
            "rule": spec.rule,
        }

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("q", "k", "v")

    def reference(self, inputs) -> torch.Tensor:  # noqa: ANN001 - the inputs mapping, in float64
        """The baseline's math on float64 copies, a slice of query rows at a time, so that the truth of a
        16k-token case fits beside the variants (the plain baseline holds B*H*S*S scores at once)."""
        return lsh_attention_reference(**inputs, rows_per_step=truth_rows(inputs["q"], inputs["k"]))

    def figures(self, case: Case, inputs: Mapping[str, Any], device: str) -> dict[str, dict[str, Figure]]:
        """``recall.py``'s figures on the case's q, k and rotations, for every variant that computes the
        bucketed attention; the full-attention peers see every key, so their recall and mass kept are 1."""
        got = recall(inputs["q"], inputs["k"], inputs["rotations"], inputs["n_buckets"], inputs["chunk"],
                     inputs["causal"], inputs["rule"], top_k=RECALL_TOP_K,
                     rows_per_step=truth_rows(inputs["q"], inputs["k"]))
        sq, sk = inputs["q"].shape[-2], inputs["k"].shape[-2]
        every = sk - (sq - 1) / 2 if inputs["causal"] else float(sk)  # mean keys a query may see
        top_k = f"top{RECALL_TOP_K}_recall"
        lsh = {top_k: Figure(got.top_k_recall, "ratio", True, f"share of each query's {RECALL_TOP_K} heaviest "
                                                              "keys under full attention that it sees"),
               "mass_kept": Figure(got.mass_kept, "ratio", True, "full attention's weight on the keys it sees"),
               "keys_seen": Figure(got.keys_seen, "keys", None, "distinct keys per query")}
        full = {top_k: Figure(1.0, "ratio", True, "full attention sees every key"),
                "mass_kept": Figure(1.0, "ratio", True, "full attention sees every key"),
                "keys_seen": Figure(every, "keys", None, "distinct keys per query")}
        return {name: full if name in FULL_ATTENTION else lsh for name in self.variants}

    def flops(self, case: Case, backward: bool = False) -> float:
        """4*B*H*D per (query, key) pair the kernel scores (QK^T and PV, 2 FLOPs per multiply-add): every round's
        interval, counted on one representative draw (seed ``_FLOPS_SEED``; normal q and k whatever the case's
        ``data``) of q, k and rotations; duplicates across rounds and causally masked pairs are included, since the
        kernel computes them. The backward does 2.5x the forward's matmul work. Full attention would count
        ``seq * seq`` pairs."""
        spec = _spec(case)
        pairs = _scored_pairs(case["seq"], case["head_dim"], spec.n_buckets, case["n_hashes"], spec.chunk,
                              spec.rule, spec.causal)
        fwd = 4.0 * case["batch"] * case["heads"] * pairs * case["head_dim"]
        return fwd * 3.5 if backward else fwd

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Forward: read Q, K, V, write O. Backward adds: read Q, K, V, O, dO, write dQ, dK, dV. The index
        tensors (a few int32 per token and round) are left out."""
        elems = case["batch"] * case["heads"] * case["seq"] * case["head_dim"]
        fwd = 4 * elems * case.dtype.itemsize
        return fwd + 8 * elems * case.dtype.itemsize if backward else fwd
