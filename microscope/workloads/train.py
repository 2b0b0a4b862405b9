"""The training loop, driven by a ``TrainRecipe`` and instrumented for the stability dimension.

A recipe is the hook point for recipe-level ablations (optimizer, precision, checkpointing, schedule):
two variants differ only in their recipes, while the model init (``build_model(cfg, seed)``) and the
data order (``WindowSampler(..., seed)``) stay identical. ``TrainRecipe.optimizer_factory`` swaps the
optimizer class altogether (8-bit Adam, Lion, ...).

Recorded per step (``TrainResult``): loss, learning rate, global gradient norm (before clipping),
gradient norm per layer group, update-to-parameter ratio ``||theta_new - theta_old|| / ||theta_old||``
(global and per layer group), NaN and Inf counts in the gradients, the AMP loss scale and whether the
scaler skipped the step (fp16), the step time and the tokens processed. ``step_time`` covers the work
itself -- forward, backward, unscaling, clipping, optimizer step -- and excludes the instrumentation,
so tokens/s is not diluted by measuring it. Loss spikes: ``stability.loss_spikes``.

On CPU the loop is bitwise deterministic for a seed: same model seed, data seed and recipe give the
identical loss curve.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from microscope.workloads.stability import layer_groups, loss_spikes

__all__ = ["Batches", "Distillation", "StepMetrics", "TrainRecipe", "TrainResult", "Trainer", "distillation_loss",
           "lm_loss", "lr_at", "train"]

#: ``batches(step) -> (x, y)``: input and target token ids (B, S); targets of -100 are ignored.
Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
IGNORE_INDEX = -100


@dataclass(frozen=True)
class TrainRecipe:
    """Everything about how the model is trained (the model's shape lives in ``ModelConfig``).

    ``precision``: ``"fp32"``, or autocast in ``"bf16"``/``"fp16"`` (fp16 adds a ``GradScaler``
    starting at ``init_scale``). ``checkpoint_every=k`` recomputes every k-th block in backward (0:
    off). ``lr`` is the peak rate: linear warm-up over ``warmup`` steps, then cosine decay to
    ``min_lr_ratio * lr`` at the last step. Weight decay applies to matrices only (not norms).
    ``batch_size`` is the rows per step the batch source must deliver (``train`` checks it).
    ``optimizer_kwargs`` are passed to AdamW (e.g. ``foreach``, ``fused``) or to ``optimizer_factory``,
    which, when given, builds the optimizer from the parameter groups and the recipe. ``seed`` seeds
    the loop's own random state (dropout); data order and init have their own seeds.
    """

    steps: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    precision: str = "fp32"
    init_scale: float = 2.0**16
    checkpoint_every: int = 0
    optimizer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer_factory: Callable[[list[dict[str, Any]], TrainRecipe], torch.optim.Optimizer] | None = None
    seed: int = 0
    spike_window: int = 20
    spike_k: float = 3.0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if self.warmup < 0 or self.checkpoint_every < 0:
            raise ValueError("warmup and checkpoint_every must be >= 0")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")
        object.__setattr__(self, "betas", tuple(self.betas))


def lr_at(step: int, recipe: TrainRecipe) -> float:
    """Learning rate of ``step`` (0-based): linear warm-up to ``lr``, cosine to ``min_lr_ratio * lr``."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    span = max(1, recipe.steps - recipe.warmup - 1)
    progress = min(1.0, (step - recipe.warmup) / span)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in float32; targets equal to -100 are ignored."""
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


@dataclass(frozen=True)
class Distillation:
    """Knowledge distillation (Hinton et al.): the training loss becomes ``(1 - weight) * lm_loss + weight *
    distillation_loss`` against a frozen ``teacher``'s logits at ``temperature``."""

    teacher: nn.Module
    weight: float = 0.5
    temperature: float = 2.0


def distillation_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` of the distributions softened by ``T``, in float32, averaged over the
    positions that have a target (the same positions as ``lm_loss``); ``T^2`` keeps the gradient's scale
    independent of ``T``."""
    keep = targets.flatten() != IGNORE_INDEX
    student = F.log_softmax(logits.float().flatten(0, -2)[keep] / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.float().flatten(0, -2)[keep] / temperature, dim=-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
    return kl * temperature**2


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, recipe: TrainRecipe) -> torch.optim.Optimizer:
    """AdamW with the recipe's betas/eps/decay, or whatever ``recipe.optimizer_factory`` builds."""
    groups = _param_groups(model, recipe.weight_decay)
    if recipe.optimizer_factory is not None:
        return recipe.optimizer_factory(groups, recipe)
    return torch.optim.AdamW(
        groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps, **recipe.optimizer_kwargs
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepMetrics:
    """What one step measured (the instrumented fields are NaN/0 when instrumentation is off)."""

    loss: float
    lr: float
    grad_norm: float
    layer_grad_norm: list[float]
    update_ratio: float
    layer_update_ratio: list[float]
    nan_count: int
    inf_count: int
    loss_scale: float
    skipped: bool
    step_time: float
    tokens: int


class Trainer:
    """One model, its optimizer and (fp16) grad scaler; ``step(step, x, y)`` trains on one batch.

    ``instrument=False`` skips the per-layer statistics and the parameter snapshot they need (used
    when measuring the peak memory of a bare train step). ``distill`` adds a frozen teacher's soft targets
    to the loss (its forward is inside the timed step: it is part of what distillation costs).
    """

    def __init__(
        self,
        model: nn.Module,
        recipe: TrainRecipe,
        device: torch.device | str | None = None,
        instrument: bool = True,
        distill: Distillation | None = None,
    ) -> None:
        self.model = model
        self.distill = distill
        if distill is not None:
            distill.teacher.eval().requires_grad_(False)
        self.recipe = recipe
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.instrument = instrument
        self.amp_dtype = PRECISIONS[recipe.precision]
        self.optimizer = build_optimizer(model, recipe)
        self.scaler = (
            torch.amp.GradScaler(self.device.type, init_scale=recipe.init_scale)
            if (recipe.precision == "fp16")
            else None
        )
        self.params = [p for p in model.parameters() if p.requires_grad]
        named = dict(model.named_parameters())
        index = {id(p): i for i, p in enumerate(self.params)}
        self.groups = [(name, [index[id(named[n])] for n in names]) for name, names in layer_groups(model)]
        if hasattr(model, "set_checkpointing"):
            model.set_checkpointing(recipe.checkpoint_every)

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.groups)

    def _group_norms(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(global norm, per-group norms) of per-parameter tensors, in float32."""
        sq = torch.stack([t.float().pow(2).sum() for t in tensors])
        per_group = torch.stack([sq[idx].sum() for _, idx in self.groups]).sqrt()
        return sq.sum().sqrt(), per_group

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepMetrics:
        model, opt, scaler, recipe = self.model, self.optimizer, self.scaler, self.recipe
        model.train()
        lr = lr_at(step, recipe)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)

        _sync(self.device)
        t0 = time.perf_counter()
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None
        ):
            logits = model(x)
            if self.distill is not None:
                with torch.no_grad():
                    teacher_logits = self.distill.teacher(x)
        label_loss = loss = lm_loss(logits, y)
        if self.distill is not None:  # trained on the mix, recorded as the label loss (comparable across arms)
            soft = distillation_loss(logits, teacher_logits, y, self.distill.temperature)
            loss = (1.0 - self.distill.weight) * label_loss + self.distill.weight * soft
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        _sync(self.device)
        elapsed = time.perf_counter() - t0

        nan = inf = 0
        grad_norm, layer_grad, prev = math.nan, [], None
        if self.instrument:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            total, per_group = self._group_norms(grads)
            counts = torch.stack([sum(g.isnan().sum() for g in grads), sum(g.isinf().sum() for g in grads)])
            nan, inf = (int(c) for c in counts.tolist())
            grad_norm, layer_grad = float(total), per_group.tolist()
            prev = [p.detach().clone() for p in self.params]

        scale = scaler.get_scale() if scaler is not None else math.nan
        _sync(self.device)
        t1 = time.perf_counter()
        if recipe.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, recipe.grad_clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        _sync(self.device)
        elapsed += time.perf_counter() - t1
        skipped = scaler is not None and scaler.get_scale() < scale

        update_ratio, layer_update = math.nan, []
        if prev is not None:
            delta_total, delta_group = self._group_norms([p.detach() - q for p, q in zip(self.params, prev)])
            base_total, base_group = self._group_norms(prev)
            update_ratio = float(delta_total / base_total)
            layer_update = (delta_group / base_group).tolist()
        return StepMetrics(
            loss=float(label_loss.detach()),
            lr=lr,
            grad_norm=grad_norm,
            layer_grad_norm=layer_grad,
            update_ratio=update_ratio,
            layer_update_ratio=layer_update,
            nan_count=nan,
            inf_count=inf,
            loss_scale=scale,
            skipped=skipped,
            step_time=elapsed,
            tokens=int(x.numel()),
        )


@dataclass
class TrainResult:
    """Per-step arrays of one training run (length ``steps``; per-layer arrays are steps x groups)."""

    loss: np.ndarray
    lr: np.ndarray
    grad_norm: np.ndarray
    layer_grad_norm: np.ndarray
    update_ratio: np.ndarray
    layer_update_ratio: np.ndarray
    nan_count: np.ndarray
    inf_count: np.ndarray
    loss_scale: np.ndarray
    skipped: np.ndarray
    step_time: np.ndarray
    tokens: np.ndarray
    layer_names: tuple[str, ...]
    spike_window: int = 20
    spike_k: float = 3.0

    @classmethod
    def from_steps(
        cls, steps: list[StepMetrics], layer_names: tuple[str, ...], recipe: TrainRecipe
    ) -> TrainResult:
        def col(name: str, dtype: Any) -> np.ndarray:
            return np.asarray([getattr(s, name) for s in steps], dtype=dtype)

        return cls(
            loss=col("loss", np.float64),
            lr=col("lr", np.float64),
            grad_norm=col("grad_norm", np.float64),
            layer_grad_norm=col("layer_grad_norm", np.float64).reshape(len(steps), -1),
            update_ratio=col("update_ratio", np.float64),
            layer_update_ratio=col("layer_update_ratio", np.float64).reshape(len(steps), -1),
            nan_count=col("nan_count", np.int64),
            inf_count=col("inf_count", np.int64),
            loss_scale=col("loss_scale", np.float64),
            skipped=col("skipped", bool),
            step_time=col("step_time", np.float64),
            tokens=col("tokens", np.int64),
            layer_names=layer_names,
            spike_window=recipe.spike_window,
            spike_k=recipe.spike_k,
        )

    @property
    def spikes(self) -> np.ndarray:
        """Loss-spike mask by the recipe's window and k (definition: ``stability.loss_spikes``)."""
        return loss_spikes(self.loss, self.spike_window, self.spike_k)

    def tokens_per_s(self, skip: int = 1) -> float:
        """Training throughput over the steps after the first ``skip`` (warm-up, allocator, caches)."""
        if skip >= len(self.loss):
            raise ValueError(f"cannot skip {skip} of {len(self.loss)} steps")
        return float(self.tokens[skip:].sum() / self.step_time[skip:].sum())

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, for JSON records."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["spikes"] = self.spikes.tolist()
        return out


def train(
    model: nn.Module,
    batches: Batches,
    recipe: TrainRecipe,
    device: torch.device | str | None = None,
    on_step: Callable[[int, StepMetrics], None] | None = None,
    distill: Distillation | None = None,
) -> TrainResult:
    """Train ``model`` in place for ``recipe.steps`` steps on ``batches(step)``; return the per-step record.

    ``on_step(step, metrics)`` is called after every step (e.g. to stream to TensorBoard). The
    caller's global random state is left untouched: the loop forks it and seeds ``recipe.seed``.
    ``distill``: learn from a teacher's soft targets too (``Distillation``); the recorded loss stays the label
    loss, so it compares with arms trained without a teacher.
    """
    trainer = Trainer(model, recipe, device, distill=distill)
    dev = trainer.device
    rng_devices = (
        [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    )
    steps: list[StepMetrics] = []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(recipe.seed)
        for step in range(recipe.steps):
            x, y = batches(step)
            if x.shape[0] != recipe.batch_size:
                raise ValueError(
                    f"batches({step}) gave {x.shape[0]} rows but recipe.batch_size={recipe.batch_size}"
                )
            metrics = trainer.step(step, x.to(dev), y.to(dev))
            steps.append(metrics)
            if on_step is not None:
                on_step(step, metrics)
    return TrainResult.from_steps(steps, trainer.group_names, recipe)
