"""Expert parallel for ``MoE`` layers: each rank holds ``experts / world_size`` experts and the tokens travel to
them through ``all_to_all_single`` (counts first, then the rows, then the outputs back). The ``ep`` strategy
(``strategies``) leaves the rest to DDP."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from microscope.distributed.context import RankContext
from microscope.distributed.trainer import mark_rank_local
from microscope.workloads.moe import MoE

__all__ = ["AllToAllExperts", "all_to_all", "split_experts"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` whose backward sends the gradients back the way the rows came (splits swapped)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    # through the module attribute, so CommCounter's wrapper sees (and counts) the call
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any = None) -> torch.Tensor:
    """Rows ``in_splits[j]`` of ``x`` go to rank j; ``out_splits[i]`` rows come from rank i (differentiable)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class AllToAllExperts:
    """``MoE.experts_fn`` for a rank holding experts ``[rank * local, (rank + 1) * local)``: rows sorted by expert
    are already grouped by the rank that holds them, so one all-to-all dispatches them and the reverse one
    brings the outputs back in the same order."""

    def __init__(self, rank: int, world_size: int, group: Any) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group

    def __call__(self, moe: MoE, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        world, local = self.world_size, moe.num_experts // self.world_size
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.group)  # recv[i * local + j]: rank i's rows for my j
        recv = recv.view(world, local)
        in_splits = counts.view(world, local).sum(1).tolist()
        out_splits = recv.sum(1).tolist()
        received = all_to_all(rows, out_splits, in_splits, self.group)  # (source rank, local expert) order
        expert_of = torch.arange(local, device=rows.device).repeat(world).repeat_interleave(recv.flatten())
        order = expert_of.argsort(stable=True)
        chunks = received[order].split(recv.sum(0).tolist())
        first = self.rank * local
        out = torch.cat([moe.experts[str(first + j)](chunk) for j, chunk in enumerate(chunks)])
        return all_to_all(out[order.argsort()], in_splits, out_splits, self.group)


def _gather_experts(moe: nn.Module, state: dict, prefix: str, _meta: object) -> None:
    """state_dict post-hook of a split ``MoE``: the other ranks' experts added under their global keys, the
    layer's keys kept in the unsplit layer's order (collective: every rank calls ``state_dict``, as the
    launcher does)."""
    mine = {k[len(prefix):]: state.pop(k) for k in [k for k in state if k.startswith(prefix)]}
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {k: v.detach().cpu() for k, v in mine.items() if k.startswith("experts.")})
    merged = {k: v for part in parts for k, v in part.items()}
    merged.update((k, v) for k, v in mine.items() if k.startswith("experts."))
    for key, value in mine.items():
        if not key.startswith("experts."):
            state[prefix + key] = value
    for e in range(moe.num_experts):
        for key, value in merged.items():
            if key.startswith(f"experts.{e}."):
                state[prefix + key] = value


def split_experts(model: nn.Module, ctx: RankContext) -> list[str]:
    """Keep, in every ``MoE`` of ``model``, experts ``[rank * E/N, (rank + 1) * E/N)`` under their global names,
    route its tokens through ``AllToAllExperts`` and mark those experts rank-local, their gradients divided
    by N; returns their parameter names (for DDP to ignore). Raises ``ValueError`` unless N divides E."""
    world = ctx.world_size
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError("ep: the model has no MoE layers (apply microscope.api.use_moe in the arm's patch)")
    for name, moe in layers:
        if moe.num_experts % world:
            raise ValueError(f"ep: {name} has {moe.num_experts} experts, not divisible by world_size={world} "
                             "(each rank holds experts / world_size whole experts)")
    group = dist.new_group(backend=ctx.backend)  # the expert-parallel group: its all-to-alls queue apart from DDP's
    names = []
    for name, moe in layers:
        local = moe.num_experts // world
        moe.experts = nn.ModuleDict({str(e): moe.experts[e] for e in range(ctx.rank * local, (ctx.rank + 1) * local)})
        moe.experts_fn = AllToAllExperts(ctx.rank, world, group)
        moe.register_state_dict_post_hook(_gather_experts)
        for pname, p in moe.experts.named_parameters():
            names.append(f"{name}.experts.{pname}")
            # every rank's local-mean loss reaches this expert: / N makes it the global mean, as DDP's average
            p.register_hook(lambda g: g / world)
        mark_rank_local(moe.experts.parameters())
    return names
