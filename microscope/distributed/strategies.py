"""The distribution strategies, each a picklable ``Strategy``: ``(model, RankContext) -> module to train``.

All go through PyTorch's own stack (DDP and its comm hooks, FSDP2 ``fully_shard``, DTensor tensor
parallel, ``torch.distributed.pipelining``); only the 1-bit sign hook (``sign.py``) and expert parallel's
token exchange (``expert_parallel.py``, over ``all_to_all_single``) are home-made.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from microscope.distributed.context import RankContext, add_note, own_step, whole_batch
from microscope.distributed.expert_parallel import split_experts
from microscope.distributed.pipeline import StageModule
from microscope.distributed.sign import SignState, sign_hook

__all__ = [
    "POWERSGD_RANK",
    "POWERSGD_START_ITER",
    "PP_MICROBATCHES",
    "STRATEGIES",
    "ddp",
    "ddp_powersgd",
    "ddp_sign",
    "ep",
    "powersgd_claimed_reduction",
    "pp",
    "tp",
    "zero2",
    "zero3",
    "zero3_offload",
]

POWERSGD_RANK = 1
#: torch's PowerSGD with error feedback must allreduce uncompressed for the first 2 steps
POWERSGD_START_ITER = 2
POWERSGD_MIN_COMPRESSION = 2.0
#: microbatches per global batch in ``pp`` (GPipe on p stages: m / (m + p - 1) of the time busy)
PP_MICROBATCHES = 4


def _ddp(model: nn.Module, ctx: RankContext) -> DistributedDataParallel:
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model.to(ctx.device), device_ids=ids)


def ddp(model: nn.Module, ctx: RankContext) -> nn.Module:
    """Plain DDP allreduce (the baseline), through torch's ``allreduce_hook`` so the bytes are counted."""
    wrapped = _ddp(model, ctx)
    wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
    return wrapped


def ddp_powersgd(model: nn.Module, ctx: RankContext) -> nn.Module:
    """DDP with torch's PowerSGD hook: rank-1 approximations, error feedback, warm start."""
    wrapped = _ddp(model, ctx)
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=POWERSGD_RANK,
        start_powerSGD_iter=POWERSGD_START_ITER,
        min_compression_rate=POWERSGD_MIN_COMPRESSION,
        use_error_feedback=True,
        warm_start=True,
        random_seed=0,
    )
    wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    add_note(f"ddp_powersgd: the first {POWERSGD_START_ITER} steps are plain allreduce (torch's PowerSGD "
             "needs them with error feedback); compression starts after")
    return wrapped


def ddp_sign(model: nn.Module, ctx: RankContext) -> nn.Module:
    """DDP with 1-bit sign compression (error feedback, a scale per tensor), signs packed 8 per byte."""
    wrapped = _ddp(model, ctx)
    wrapped.register_comm_hook(SignState(), sign_hook)
    add_note("ddp_sign: signs are packed 8 per uint8 and all_gathered (gloo/nccl carry no 1-bit type, and "
             "packed signs cannot be summed by allreduce): each rank passes ~1/32 of the fp32 bytes but "
             "receives world_size times that")
    return wrapped


def _shard(model: nn.Module, ctx: RankContext, reshard: bool, offload: bool = False) -> nn.Module:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    model = model.to(ctx.device)
    for block in getattr(model, "blocks", []):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def zero2(model: nn.Module, ctx: RankContext) -> nn.Module:
    """FSDP2 without resharding after forward: gathered params live through backward; grads and optimizer
    state sharded."""
    add_note("zero2: FSDP2 keeps only local parameter shards between steps (param_bytes); unlike zero3 it "
             "holds the gathered parameters from forward through backward (one all-gather per step instead "
             "of two: see bytes_sent)")
    return _shard(model, ctx, reshard=False)


def zero3(model: nn.Module, ctx: RankContext) -> nn.Module:
    """FSDP2 resharding after forward: params, grads and optimizer state all sharded (~1/N per rank)."""
    return _shard(model, ctx, reshard=True)


def zero3_offload(model: nn.Module, ctx: RankContext) -> nn.Module:
    """zero3 with ``CPUOffloadPolicy``: shards, grads and the optimizer step live in host memory."""
    if ctx.device.type == "cpu":
        add_note("zero3_offload: on a CPU-only run the offload is a no-op (parameters already live in host "
                 "memory); it equals zero3 here")
    return _shard(model, ctx, reshard=True, offload=True)


def _qkv_rows(n_heads: int, head_dim: int, world: int, to_rank_major: bool) -> torch.Tensor:
    """Row order of the fused qkv weight: (q|k|v, heads) <-> (rank, q|k|v, its heads), so that a contiguous
    1/N row shard (what ``ColwiseParallel`` takes) holds q, k and v of the rank's own heads (Megatron's
    layout); ``to_rank_major=False`` gives the inverse."""
    idx = torch.arange(3 * n_heads * head_dim)
    if to_rank_major:
        return idx.view(3, world, n_heads // world, head_dim).transpose(0, 1).reshape(-1)
    return idx.view(world, 3, n_heads // world, head_dim).transpose(0, 1).reshape(-1)


def _restore_qkv(model: nn.Module, state: dict, prefix: str, _meta: object) -> None:
    """state_dict post-hook: gather each fused qkv weight and put its rows back in the model's order
    (collective: every rank calls ``state_dict``, as ``_full_state_dict`` does)."""
    for i, block in enumerate(model.blocks):
        key = f"{prefix}blocks.{i}.attn.qkv.weight"
        w = state[key]
        w = w.full_tensor() if hasattr(w, "full_tensor") else w
        state[key] = w[_qkv_rows(model.cfg.n_heads, block.attn.head_dim, block.attn.tp_world, False)]


@whole_batch
def tp(model: nn.Module, ctx: RankContext) -> nn.Module:
    """Megatron tensor parallel through DTensor: q/k/v and MLP up/gate column-parallel, attention output and
    MLP down row-parallel (one all-reduce each in forward and backward per block); embeddings, norms and
    the output head replicated. Every rank trains on the whole batch."""
    cfg, world = model.cfg, ctx.world_size
    if cfg.n_heads % world:
        raise ValueError(f"tp: n_heads={cfg.n_heads} is not divisible by world_size={world} "
                         "(each rank computes n_heads / world_size whole heads)")
    if cfg.hidden_dim % world:
        raise ValueError(f"tp: the MLP width {cfg.hidden_dim} is not divisible by world_size={world}")
    if cfg.mlp_norm:
        raise ValueError("tp: mlp_norm normalises over the whole MLP hidden layer, which tp splits across ranks")
    mesh = init_device_mesh(ctx.device.type, (world,))
    model = model.to(ctx.device)
    for block in model.blocks:
        attn = block.attn
        with torch.no_grad():
            attn.qkv.weight.copy_(attn.qkv.weight[_qkv_rows(cfg.n_heads, attn.head_dim, world, True)])
        plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
        if block.mlp.gate is not None:
            # SwiGLU: gate and up share one replicated input, so its gradient is all-reduced once (Megatron's
            # f), not once per projection
            plan["mlp"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                             use_local_output=False)
            plan["mlp.gate"] = ColwiseParallel()
        parallelize_module(block, mesh, plan)  # outputs are plain local tensors (use_local_output)
        attn.n_heads, attn.tp_world = cfg.n_heads // world, world  # the local q/k/v hold n_heads / N heads
    model.register_state_dict_post_hook(_restore_qkv)
    add_note("tp: every rank trains on the whole global batch (tensor parallel is not data parallel): the "
             "loss and tokens are rank 0's; param_bytes are the local shards of the q/k/v, attention "
             "output and MLP weights plus the full replicated embeddings, norms and output head")
    return model


@own_step
def pp(model: nn.Module, ctx: RankContext) -> nn.Module:
    """Pipeline parallel (``torch.distributed.pipelining``, GPipe, ``PP_MICROBATCHES`` microbatches): rank r
    holds stage r, an equal run of blocks (the embedding on the first, the final norm and head on the last),
    and trains it itself (``StageModule.rank_trainer``). Every rank gets the whole batch."""
    if model.cfg.n_layers % ctx.world_size:
        raise ValueError(f"pp: n_layers={model.cfg.n_layers} is not divisible by world_size={ctx.world_size} "
                         "(each rank holds n_layers / world_size blocks)")
    add_note(f"pp: GPipe over {PP_MICROBATCHES} microbatches, one stage per rank; the loss is the last stage's "
             "(the mean of its microbatch losses), tokens are the whole batch; bytes_sent are the activations "
             "sent forward and their gradients sent back (scalar norm and loss reductions not counted)")
    return StageModule(model, ctx.rank, ctx.world_size, PP_MICROBATCHES).to(ctx.device)


def ep(model: nn.Module, ctx: RankContext) -> nn.Module:
    """Expert parallel for a model with ``MoE`` layers (``microscope.api.use_moe``): each rank keeps E/N experts
    of every layer and sends each token to its experts' ranks with ``all_to_all_single``
    (``expert_parallel.split_experts``); the rest is plain DDP over rows ``rank::N``, the experts left out of
    its all-reduce."""
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, split_experts(model, ctx))
    add_note("ep: each rank holds experts / world_size experts of every MoE layer and trains on rows rank::N; "
             "bytes_sent are DDP's all-reduce of the non-expert gradients plus, per MoE layer and step, the "
             "expert counts (E int64) and four all-to-alls of (tokens x top_k, d_model) rows (dispatch and "
             "combine, and their gradients in backward), counted whole: the rows a rank keeps for its own "
             "experts included; routing is unregularized (no load-balancing loss)")
    return ddp(model, ctx)


STRATEGIES = {f.__name__: f for f in (ddp, ddp_powersgd, ddp_sign, zero2, zero3, zero3_offload, tp, pp, ep)}


def powersgd_claimed_reduction(model: nn.Module, rank: int = POWERSGD_RANK,
                               min_compression_rate: float = POWERSGD_MIN_COMPRESSION) -> float:
    """fp32 allreduce bytes over PowerSGD's per-step bytes once compressing: a (n, m) gradient sends
    (n + m) * rank values; vectors, and matrices it would not shrink by ``min_compression_rate``, go whole."""
    full = sent = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        full += p.numel()
        if p.dim() > 1:
            n, m = p.shape[0], p.numel() // p.shape[0]
            r = min(n, m, rank)
            if (n + m) * r * min_compression_rate < n * m:  # torch's _should_compress
                sent += (n + m) * r
                continue
        sent += p.numel()
    return full / sent


