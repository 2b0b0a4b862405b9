"""Pipeline parallel through ``torch.distributed.pipelining``: one stage of the Transformer per rank and the
rank's own training step (``PipelineTrainer``), which ``Trainer.step`` cannot express."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.checkpoint import checkpoint

from microscope.distributed.counting import CommCounter
from microscope.workloads.stability import layer_groups
from microscope.workloads.train import PRECISIONS, StepMetrics, TrainRecipe, build_optimizer, lm_loss, lr_at

__all__ = ["PipelineTrainer", "StageModule"]


class StageModule(nn.Module):
    """Stage ``index`` of ``count``: blocks ``[index * n / count, (index + 1) * n / count)``, the embedding on
    the first stage, the final norm and output head on the last. Parameter names are the full model's
    (``blocks`` is a ModuleDict keyed by the global block index); ``state_dict`` gathers every stage's
    weights (collective: all ranks must call it)."""

    def __init__(self, model: nn.Module, index: int, count: int, microbatches: int) -> None:
        super().__init__()
        per = model.cfg.n_layers // count
        self.cfg, self.index, self.count, self.microbatches = model.cfg, index, count, microbatches
        self.group_names = tuple(name for name, _ in layer_groups(model))  # the full model's, in order
        self.embed = model.embed if index == 0 else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(index * per, (index + 1) * per)})
        self.norm = model.norm if index == count - 1 else None
        self.lm_head = model.lm_head if index == count - 1 else None
        self.rotary = model.rotary
        self.register_state_dict_post_hook(_gather_stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        cos, sin = self.rotary(0, x.shape[1], x.device)
        for block in self.blocks.values():
            if block.checkpoint and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x

    def rank_trainer(self, recipe: TrainRecipe, device: torch.device, counter: CommCounter) -> PipelineTrainer:
        """The launcher's seam for an ``@own_step`` strategy: this rank's trainer."""
        return PipelineTrainer(self, recipe, device, counter)


def _gather_stages(module: StageModule, state: dict, prefix: str, _meta: object) -> None:
    """state_dict post-hook: add the other stages' weights (all ranks call ``state_dict``)."""
    parts: list[Any] = [None] * module.count
    dist.all_gather_object(parts, {k: v.detach().cpu() for k, v in state.items()})
    for part in parts:
        for key, value in part.items():
            state.setdefault(key, value)


class PipelineTrainer:
    """One stage's training step: a GPipe schedule over ``microbatches`` microbatches (the loss on the last
    stage, broadcast to every rank), AdamW on the stage's own parameters with the recipe's lr schedule,
    clipping by the global norm across stages. Statistics cover the whole model (scalar reductions across
    stages, not counted as traffic)."""

    def __init__(self, module: StageModule, recipe: TrainRecipe, device: torch.device, counter: CommCounter) -> None:
        if recipe.precision == "fp16":
            raise ValueError("pp: fp16 needs a GradScaler across stages, which this pipeline does not do; "
                             "use fp32 or bf16")
        if recipe.batch_size % module.microbatches:
            raise ValueError(f"pp: batch_size={recipe.batch_size} is not divisible by the "
                             f"{module.microbatches} microbatches")
        self.module, self.recipe, self.device, self.counter = module, recipe, device, counter
        self.amp_dtype = PRECISIONS[recipe.precision]
        self.optimizer = build_optimizer(module, recipe)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.group_names: tuple[str, ...] = module.group_names
        local = dict(layer_groups(module))
        named = dict(module.named_parameters())
        index = {id(p): i for i, p in enumerate(self.params)}
        self.groups = [(g, [index[id(named[n])] for n in local.get(g, [])]) for g in self.group_names]
        for i, block in module.blocks.items():
            every = recipe.checkpoint_every
            block.checkpoint = every > 0 and int(i) % every == 0
        self.first, self.last = module.index == 0, module.index == module.count - 1
        self.schedule = ScheduleGPipe(PipelineStage(module, module.index, module.count, device),
                                      module.microbatches, loss_fn=lm_loss)

    def _reduced(self, tensors: list[torch.Tensor], extra: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Per-group squared norms of ``tensors`` (then ``extra``), summed over the stages (uncounted)."""
        sq = [t.float().pow(2).sum() for t in tensors]
        zero = torch.zeros((), device=self.device)
        out = torch.stack([sum((sq[i] for i in idx), zero) for _, idx in self.groups] + (extra or []))
        with self.counter.paused():
            dist.all_reduce(out)
        return out

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepMetrics:
        """Train on the whole global batch ``x, y`` (every rank passes it; each stage uses its part)."""
        module, opt, recipe = self.module, self.optimizer, self.recipe
        module.train()
        lr = lr_at(step, recipe)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        self._sync()
        t0 = time.perf_counter()
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            self.schedule.step(*args, **kwargs)
        self._sync()
        elapsed = time.perf_counter() - t0

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        counts = [sum((g.isnan().sum() for g in grads), torch.zeros((), dtype=torch.long)).float(),
                  sum((g.isinf().sum() for g in grads), torch.zeros((), dtype=torch.long)).float()]
        red = self._reduced(grads, counts)
        per_group, total = red[:-2].sqrt(), red[:-2].sum().sqrt()
        prev = [p.detach().clone() for p in self.params]
        loss = torch.stack(losses).mean().detach().float() if self.last else torch.zeros((), device=self.device)
        with self.counter.paused():
            dist.broadcast(loss, src=module.count - 1)

        self._sync()
        t1 = time.perf_counter()
        if recipe.grad_clip is not None:  # torch's clip_grad_norm_ formula with the global norm
            coef = torch.clamp(recipe.grad_clip / (total + 1e-6), max=1.0)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(coef.to(p.grad.device))
        opt.step()
        self._sync()
        elapsed += time.perf_counter() - t1

        delta = self._reduced([p.detach() - q for p, q in zip(self.params, prev)])
        base = self._reduced(prev)
        return StepMetrics(
            loss=float(loss), lr=lr, grad_norm=float(total), layer_grad_norm=per_group.tolist(),
            update_ratio=float(delta.sum().sqrt() / base.sum().sqrt()),
            layer_update_ratio=(delta.sqrt() / base.sqrt()).tolist(),
            nan_count=int(red[-2]), inf_count=int(red[-1]), loss_scale=math.nan, skipped=False,
            step_time=elapsed, tokens=int(x.numel()),
        )
