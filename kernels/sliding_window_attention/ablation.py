"""The sliding_window_attention plugin: local windows, global tokens and BigBird random blocks in one Triton
kernel that skips masked tiles, against eager attention with the same dense mask (GitHub issue #24).

Case parameters: ``batch``, ``heads``, ``seq`` (queries = keys), ``head_dim``, ``window`` (``|i - j| <
window``; causal: ``0 <= i - j < window``), ``globals`` (number of global tokens, the first positions),
``random_blocks`` (BigBird random key blocks per query block, drawn from the harness's seeded generator as
an input tensor), ``block`` (BigBird block size), ``causal``, ``dtype``. ``mask.py`` defines the mask.

Model level: the embedded model trained with windowed attention in every block, or in every block but the
last (which keeps full attention), against full attention; the model-level runner's generalization
dimension evaluates every arm at 2x and 4x the trained context (``val_loss_2x``, ``val_loss_4x``).
"""

from __future__ import annotations

import functools

import torch
from microscope_kernels.attention_inputs import ATTENTION_TOLERANCE, gpu_memory_refusal, require_compiled, truth_rows
from microscope_kernels.flash_attn.kernel import precompile as compile_flash_candidates

from microscope.api import (
    Ablation,
    Arm,
    Case,
    ModelShapes,
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

from .kernel import SUPPORTED_HEAD_DIMS, sliding_window_attention
from .kernel import precompile as compile_candidates
from .mask import MaskSpec, block_pairs, count_visible, n_blocks, random_block_pattern
from .model import model_attention_calls, use_full_flash_attention, use_window_attention
from .peers import PEERS, Peer
from .reference import masked_attention

#: Seed of the representative random pattern ``flops`` counts pairs on (the inputs' patterns come from the
#: harness's generator; BigBird's choice rule makes their pair counts equal but for a short last block).
_FLOPS_PATTERN_SEED = 0
#: Share of the available GPU memory the eager baseline's (S x S) matrices may take (``_eager_supports``).
EAGER_MEMORY_SHARE = 0.9


def _spec(case: Case) -> MaskSpec:
    """The case's mask, with every mask parameter checked (a clear message for a bad config value)."""
    for name in ("batch", "heads", "seq"):
        if isinstance(case[name], bool) or not isinstance(case[name], int) or case[name] < 1:
            raise ValueError(f"case parameter {name} must be a positive integer, got {case[name]!r}")
    if isinstance(case["random_blocks"], bool) or not isinstance(case["random_blocks"], int) \
            or case["random_blocks"] < 0:
        raise ValueError(f"case parameter random_blocks must be an integer >= 0, got {case['random_blocks']!r}")
    return MaskSpec(window=case["window"], causal=bool(case["causal"]), globals=case["globals"], block=case["block"])


def _pattern(case: Case, spec: MaskSpec, gen: torch.Generator, device: str) -> torch.Tensor:
    return random_block_pattern(spec, case["seq"], case["random_blocks"], gen, device)


def _may_have_empty_rows(case: Case) -> bool:
    """Whether some query can see no key: only with neither neighbours nor global tokens."""
    return case["window"] == 0 and case["globals"] == 0


def _peer_variant(p: Peer, description: str):
    """A peer variant whose ``supports`` asks the backend's own rule (dtype, head dim, device...)."""

    def supports(case: Case, device: str) -> str | None:
        return p.supports(case["head_dim"], case.dtype, device, _may_have_empty_rows(case))

    return peer(p.fn, description, supports=supports)


def _triton_supports(case: Case, device: str) -> str | None:
    if case["head_dim"] not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {case['head_dim']} not in {SUPPORTED_HEAD_DIMS}"
    return None


def _eager_supports(case: Case, device: str) -> str | None:
    """Skip, on a GPU too small for it, a case whose eager forward would hold more than
    ``EAGER_MEMORY_SHARE`` of the available memory: three (B, H, S, S) matrices of the case's dtype alive at
    once (scores, their masked copy or softmax, the zeroed softmax) and the dense (S, S) boolean mask twice."""
    scores = case["batch"] * case["heads"] * case["seq"] ** 2
    need = 3 * scores * case.dtype.itemsize + 2 * case["seq"] ** 2
    return gpu_memory_refusal(need, device, EAGER_MEMORY_SHARE, "the eager forward's (S x S) matrices")


@functools.lru_cache(maxsize=256)
def _visible_pairs(seq: int, window: int, globals: int, block: int, random_blocks: int, causal: bool) -> int:
    """Visible pairs of a case's mask on the representative pattern (cached: the harness asks per record)."""
    spec = MaskSpec(window=window, causal=causal, globals=globals, block=block)
    pattern = random_block_pattern(spec, seq, random_blocks, torch.Generator().manual_seed(_FLOPS_PATTERN_SEED))
    return count_visible(spec, block_pairs(pattern, n_blocks(seq, block)), seq, seq)


def _warm_flex(case: Case, spec: MaskSpec, device: str, backward: bool) -> None:
    """One call of the compiled flex_attention peer at the case's shapes, forward only or with its backward,
    so that graph's kernels are in the inductor cache on disk before the run's first call (a cache hit
    there still traces)."""
    flex = PEERS["flex"]
    if flex.supports(case["head_dim"], case.dtype, device, _may_have_empty_rows(case)) is not None:
        return
    shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])  # static shapes: the case's own
    q, k, v = (torch.zeros(shape, device=device, dtype=case.dtype) for _ in range(3))
    pattern = _pattern(case, spec, torch.Generator().manual_seed(0), device)
    inputs = {"q": q, "k": k, "v": v, "pattern": pattern, "window": spec.window, "globals": spec.globals,
              "block": spec.block, "causal": spec.causal}
    call_as_timed(flex.fn, inputs, ("q", "k", "v") if backward else ())
    torch.cuda.synchronize()


@register("sliding_window_attention")
class SlidingWindowAttention(Ablation):
    """Sliding-window + global + BigBird-random attention in one tile-skipping Triton kernel vs eager masked."""

    variants = {
        "eager": baseline(masked_attention, "dense mask, matmul, masked softmax, matmul in plain PyTorch",
                          supports=_eager_supports),
        "triton": candidate(sliding_window_attention, "Triton kernel visiting only the tiles the mask touches",
                            needs=("triton",), supports=_triton_supports),
        "flex": _peer_variant(PEERS["flex"], "torch flex_attention, compiled, BlockMask from the same mask"),
        "sdpa_masked": _peer_variant(PEERS["sdpa_masked"], "torch SDPA with the dense boolean mask"),
    }
    cases = grid(batch=[1], heads=[2], seq=[100], head_dim=[64], window=[24], globals=[2], random_blocks=[1],
                 block=[16], causal=[False, True], dtype=["fp32", "bf16"])
    #: Model level: full attention vs windowed attention (``model.py``), all in the embedded model.
    arms = {
        "full": Arm(Role.BASELINE, "the embedded model's full (eager) causal attention in every block"),
        "window": Arm(description="causal sliding window (context/4) through the Triton kernel in every block",
                      patch=use_window_attention, needs=("triton",)),
        "window_last_full": Arm(description="the sliding window in every block but the last, which keeps full "
                                            "attention",
                                patch=functools.partial(use_window_attention, keep_full_last=True),
                                needs=("triton",)),
        # the two arms above through eager masked attention: the same math, trainable for hundreds of steps on a
        # CPU (``--profile trained``), where the interpreted kernel takes minutes per step
        "window_eager": Arm(description="window, computed by eager masked attention (plain PyTorch)",
                            patch=functools.partial(use_window_attention, eager=True)),
        "window_last_full_eager": Arm(description="window_last_full, computed by eager masked attention",
                                      patch=functools.partial(use_window_attention, keep_full_last=True,
                                                              eager=True)),
        "flash_full": Arm(Role.PEER, "full causal attention through flash_attn's FA2 Triton kernel in every "
                                     "block: a fused full-attention comparator for speed and memory",
                          patch=use_full_flash_attention, needs=("triton",)),
    }
    tolerance = ATTENTION_TOLERANCE

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        spec = _spec(case)
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        return {
            "q": randn(shape, case.dtype, gen, device),
            "k": randn(shape, case.dtype, gen, device),
            "v": randn(shape, case.dtype, gen, device),
            "pattern": _pattern(case, spec, gen, device),
            "window": spec.window,
            "globals": spec.globals,
            "block": spec.block,
            "causal": spec.causal,
        }

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("q", "k", "v")

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the kernels' autotuning candidates (warps x stages) for the case's dtype, head dim,
        tiling and mask kind, and, in one shard per case, a warm-up call of the compiled flex peer."""
        if device != "cuda" or _triton_supports(case, device):
            return
        spec = _spec(case)
        for grads in warm_ways(shard, backward):  # torch.compile's own cache, one graph per way the run calls it
            _warm_flex(case, spec, device, grads)
        after = ((shard[0] - 1) % shard[1], shard[1])  # the candidates start one process on, away from the warm-up
        failed = compile_candidates(case.dtype, case["head_dim"], spec.block, case["random_blocks"] > 0, spec.causal,
                                    device, backward=backward, shard=after)
        require_compiled(failed)

    def precompile_model(self, arm: str, shapes: ModelShapes, device: str, shard: tuple[int, int]) -> None:
        """This shard of the Triton kernels arm ``arm`` runs inside the model (the window kernel's candidates,
        or flash_attn's for ``flash_full``) in every dtype and way the arm calls them: at a 16k context they were
        46 builds, 87 s, inside the first seed."""
        if device != "cuda" or shapes.model.head_dim not in SUPPORTED_HEAD_DIMS:
            return
        failed = []
        if arm == "flash_full":
            for q, k, causal, backward in model_attention_calls(shapes, device):
                failed += compile_flash_candidates(q, k, causal, backward=backward, shard=shard)
        elif arm in ("window", "window_last_full"):
            for dtype in dict.fromkeys(dtype for _, dtype in shapes.calls()):
                backward = shapes.trains and dtype == shapes.dtype  # the float32 check runs forward only
                block = MaskSpec(window=1, causal=True).block  # the model's window has no random blocks
                failed += compile_candidates(dtype, shapes.model.head_dim, block, False, True, device,
                                             backward=backward, shard=shard)
        require_compiled(failed)

    def reference(self, inputs) -> torch.Tensor:  # noqa: ANN001 - the inputs mapping, in float64
        """The baseline's math on float64 copies, a slice of query rows at a time, so that the truth of a
        32k-token case fits beside the variants (the plain baseline holds B*H*S*S scores at once)."""
        return masked_attention(**inputs, rows_per_step=truth_rows(inputs["q"], inputs["k"]))

    def flops(self, case: Case, backward: bool = False) -> float:
        """4*B*H*D per visible (query, key) pair (QK^T and PV, 2 FLOPs per multiply-add), so TFLOP/s counts
        only the work the mask asks for; the backward does 2.5x the forward's matmul work.

        Pairs are counted exactly (``mask.count_visible``) on the pattern of seed ``_FLOPS_PATTERN_SEED``.
        Full attention would count ``seq * seq`` pairs (``seq * (seq + 1) / 2`` causal).
        """
        spec = _spec(case)
        pairs = _visible_pairs(case["seq"], spec.window, spec.globals, spec.block, case["random_blocks"],
                               spec.causal)
        fwd = 4.0 * case["batch"] * case["heads"] * pairs * case["head_dim"]
        return fwd * 3.5 if backward else fwd

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Forward: read Q, K, V, write O. Backward adds: read Q, K, V, O, dO, write dQ, dK, dV."""
        elems = case["batch"] * case["heads"] * case["seq"] * case["head_dim"]
        itemsize = case.dtype.itemsize
        fwd = 4 * elems * itemsize
        return fwd + 8 * elems * itemsize if backward else fwd
