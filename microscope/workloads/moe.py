"""A mixture-of-experts MLP for the embedded model: a linear router, top-k routing, E experts shaped like the
dense MLP, no token dropping (every routed token is computed, so the layer's math is exact).

``use_moe(model, experts, top_k)`` replaces every block's ``mlp`` by a ``MoE`` upcycled from it: each expert is
a copy of the dense MLP plus small seeded noise, so a baseline and a candidate given the same patch start from
the same weights. Routing is unregularized (no load-balancing loss): an auxiliary loss would have to reach the
trainer's loss, which the model's ``forward -> logits`` contract does not carry.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable

import torch
from torch import nn

from microscope.workloads.model import MLP, Transformer

__all__ = ["UPCYCLE_NOISE", "ExpertsFn", "MoE", "use_moe"]

#: Std of the noise added to each upcycled expert, relative to the std of the dense weight it copies.
UPCYCLE_NOISE = 0.1

#: ``experts_fn(moe, rows, counts) -> out``: runs the experts on ``rows`` sorted by expert (``counts[e]`` rows
#: for expert e) and returns their outputs in the same order; expert parallel installs an all-to-all one.
ExpertsFn = Callable[["MoE", torch.Tensor, torch.Tensor], torch.Tensor]


def local_experts(moe: MoE, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Every expert on its own rows, all experts in this process. An expert with no rows still runs (on an
    empty tensor), so each expert has a gradient every step and the graph does not depend on the routing."""
    chunks = rows.split(counts.tolist())
    return torch.cat([moe.experts[e](chunk) for e, chunk in enumerate(chunks)])


class MoE(nn.Module):
    """Top-k mixture of experts over the tokens of (..., d_model): gates are the softmax of the k largest router
    logits; a token's output is the gate-weighted sum of its k experts' outputs. ``experts_fn`` is the swap
    point for where the experts run (``local_experts``: all here)."""

    def __init__(self, router: nn.Linear, experts: list[nn.Module], top_k: int = 2) -> None:
        super().__init__()
        if not 1 <= top_k <= len(experts):
            raise ValueError(f"top_k={top_k} must lie in [1, experts={len(experts)}]")
        self.router = router
        self.experts = nn.ModuleList(experts)
        self.num_experts, self.top_k = len(experts), top_k
        self.experts_fn: ExpertsFn = local_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gates (T, k) in x's dtype, chosen experts (T, k)) for the tokens ``x`` (T, d_model)."""
        top, chosen = self.router(x).float().topk(self.top_k, dim=-1)
        return top.softmax(-1).to(x.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gates, chosen = self.route(flat)
        assigned = chosen.flatten()  # (T * k,): token t's k experts at t*k .. t*k+k-1
        order = assigned.argsort(stable=True)  # the assignments grouped by expert, tokens in order
        counts = torch.bincount(assigned, minlength=self.num_experts)
        out = self.experts_fn(self, flat[order // self.top_k], counts)
        out = out[order.argsort()].view(*gates.shape, -1)  # back to (T, k, d_model)
        return (out * gates.unsqueeze(-1)).sum(1).view_as(x)


def _seed(weight: torch.Tensor) -> int:
    """A seed drawn from the dense weight's bytes: the model's init seed decides the experts' noise too."""
    data = weight.detach().float().cpu().numpy().tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1


@torch.no_grad()
def upcycle(mlp: MLP, experts: int, top_k: int, init_std: float) -> MoE:
    """A ``MoE`` whose experts copy ``mlp`` plus ``UPCYCLE_NOISE`` relative noise and whose router is drawn with
    std ``init_std``, from a generator seeded by ``mlp``'s weights (same dense weights, same MoE)."""
    first = next(mlp.parameters())
    gen = torch.Generator().manual_seed(_seed(first))
    copies = []
    for _ in range(experts):
        expert = copy.deepcopy(mlp)
        for p in expert.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen).to(p) * (UPCYCLE_NOISE * float(p.std())))
        copies.append(expert)
    d_model = mlp.up.in_features
    router = nn.Linear(d_model, experts, bias=False).to(first.device)
    router.weight.copy_(torch.randn(router.weight.shape, generator=gen) * init_std)
    return MoE(router, copies, top_k)


def use_moe(model: Transformer, experts: int = 4, top_k: int = 2) -> Transformer:
    """Replace every block's MLP by an upcycled ``MoE`` of ``experts`` experts routing each token to ``top_k``."""
    for block in model.blocks:
        if isinstance(block.mlp, MoE):
            raise ValueError("use_moe: the model's MLPs are already mixtures of experts")
        block.mlp = upcycle(block.mlp, experts, top_k, model.cfg.init_std)
    return model
