"""The plugin contract: everything a plugin author needs, and nothing else.

A plugin describes one optimization as a set of *variants* (callables over the same inputs): the
``baseline`` (the plain "before"), one or more ``candidate`` implementations, and optional ``peer``
implementations a user would pick instead. It also says which *cases* (shapes, dtypes, flags) to try,
how to make seeded inputs for a case, how close a variant must stay to a float64 evaluation of the
baseline (``Tolerance``) and how many FLOPs and bytes a case moves (for TFLOP/s, GB/s and roofline).

The harness owns everything else: timing, memory, seeding, hooks, statistics and reports. A plugin
never times itself, so every variant of every plugin is measured the same way.

Where a plugin lives: a built-in room is ``kernels/<name>/`` with the plugin in ``ablation.py`` (the
registry imports ``kernels/<name>/ablation.py`` for a config whose ``plugin:`` is ``<name>``) and a
config ``ablations/<name>.yaml`` beside the others (cases, dimensions, a ``profiles: {cuda: ...}`` entry
and a ``bench`` profile of benchmark shapes); an outside plugin is any ``.py`` file named under a
config's ``plugins:``. Model-level plugins swap parts of the embedded workload through the types
re-exported here (``Transformer``, ``EagerAttention``, ``KVCache``, ``NormGelu``, ``ConvertedLinear``
for a quantized Linear that ``Transformer.swap_linears`` puts in, ``MoE``/``use_moe`` for mixture-of-experts
MLPs); nothing else of ``microscope`` is part of the contract.

Minimal example (see ``kernels/flash_attn/ablation.py`` for a full one)::

    from microscope.api import Ablation, Tolerance, baseline, candidate, grid, register

    @register("my_softmax")
    class MySoftmax(Ablation):
        \"\"\"One-pass softmax vs torch.softmax.\"\"\"
        variants = {"reference": baseline(lambda x: torch.softmax(x, -1)),
                    "triton": candidate(my_triton_softmax)}
        cases = grid(rows=[7, 300], cols=[1000], dtype=["fp32", "bf16"])
        tolerance = {"fp32": Tolerance(rtol=1e-5), "bf16": Tolerance(rtol=2e-2)}

        def inputs(self, case, gen, device):
            return {"x": randn((case["rows"], case["cols"]), case.dtype, gen, device)}

        def bytes(self, case, backward=False):
            return 2 * case["rows"] * case["cols"] * case.dtype.itemsize
"""

from __future__ import annotations

import enum
import itertools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from microscope.workloads import ConvertedLinear, EagerAttention, KVCache, ModelConfig, NormGelu, Transformer
from microscope.workloads.moe import MoE, use_moe

__all__ = [
    "CALIBRATION_BATCHES",
    "DISTRIBUTED_STRATEGIES",  # noqa: F822 - module __getattr__ (loaded on first use)
    "DTYPES",
    "Ablation",
    "Arm",
    "Case",
    "ConvertedLinear",
    "EagerAttention",
    "Figure",
    "KVCache",
    "ModelShapes",
    "MoE",
    "NormGelu",
    "RankContext",  # noqa: F822 - module __getattr__
    "Role",
    "Tolerance",
    "Transformer",
    "Variant",
    "baseline",
    "call_as_timed",
    "candidate",
    "error_budget",
    "grid",
    "interpreting",
    "peer",
    "randn",
    "register",
    "warm_ways",
    "use_moe",
]

#: Short dtype names used in configs, cases and records.
DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (``TRITON_INTERPRET=1``).

    Kernels use it to pick a fixed small launch config (autotuning in the interpreter only burns
    time) and to work around interpreter-only gaps. The harness sets the variable before any plugin
    is imported when no GPU is present; it must be set before ``@triton.jit`` runs.
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dtype_name(dtype: torch.dtype) -> str:
    """The short name (``"bf16"``) of a torch dtype, for records and case ids."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Case:
    """One point of a plugin's case grid: named parameters such as ``seq=512, dtype="bf16"``.

    Cases are hashable and carry a stable, readable ``id`` used in records and reports.
    """

    items: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **params: Any) -> Case:
        return cls(tuple(params.items()))

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.items)

    def __getitem__(self, key: str) -> Any:
        for name, value in self.items:
            if name == key:
                return value
        raise KeyError(f"case {self.id} has no parameter {key!r}; it has {[n for n, _ in self.items]}")

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype named by the case's ``dtype`` parameter (default fp32)."""
        return DTYPES[self.get("dtype", "fp32")]

    @property
    def id(self) -> str:
        parts = []
        for name, value in self.items:
            if isinstance(value, bool):
                parts.append(name if value else f"no_{name}")
            elif name == "dtype":
                parts.append(str(value))
            else:
                parts.append(f"{name}={value}")
        return ",".join(parts)

    def __str__(self) -> str:
        return self.id


def grid(**axes: Sequence[Any]) -> list[Case]:
    """The cartesian product of the given axes, in the order given (last axis varies fastest)."""
    names = list(axes)
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"grid axis {name!r} must be a list of values, got {values!r}")
    return [Case(tuple(zip(names, combo))) for combo in itertools.product(*(axes[n] for n in names))]


@dataclass(frozen=True)
class Tolerance:
    """How far a variant's output (and gradients) may stray from the float64 evaluation of the baseline.

    Two rules, both must hold, so that neither a loose global ``allclose`` nor a lucky seed decides:

    * element rule: at most ``max_mismatch`` (a fraction) of elements may violate
      ``|y - y64| <= atol + rtol * |y64|`` -- or ``ref_factor`` times the fraction the baseline itself
      violates in the same dtype, whichever is larger;
    * noise-calibrated rule: the norm-relative error ``||y - y64|| / ||y64||`` may be at most
      ``ref_factor`` times the baseline's own norm-relative error in the same dtype (floored at the
      dtype's unit roundoff, so an exact baseline does not make the rule impossible).

    An all-zeros or constant output has a norm-relative error near 1 and can never pass.
    """

    rtol: float
    atol: float = 0.0
    ref_factor: float = 4.0
    max_mismatch: float = 0.0

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise ValueError("Tolerance rtol and atol must be >= 0")
        if self.ref_factor < 1:
            raise ValueError("Tolerance ref_factor must be >= 1 (a variant cannot beat float64 by rule)")
        if not 0 <= self.max_mismatch < 1:
            raise ValueError("Tolerance max_mismatch is a fraction in [0, 1)")


def error_budget(budget: float, *, rtol: float, atol: float, max_mismatch: float) -> dict[str, Tolerance]:
    """Per-dtype tolerances (fp32, fp16, bf16) for a lossy change, such as quantization, that may cost
    ``budget`` of norm-relative error against float64 in every dtype.

    The noise-calibrated limit is ``ref_factor`` x max(baseline's error, unit roundoff), so ``ref_factor =
    budget / unit roundoff`` admits at least the budget in each dtype; the element rule is the given
    ``rtol``, ``atol`` and ``max_mismatch`` (say what the outputs' scale makes them mean where you call it).
    """
    return {name: Tolerance(rtol=rtol, atol=atol, ref_factor=budget / (torch.finfo(DTYPES[name]).eps / 2),
                            max_mismatch=max_mismatch) for name in ("fp32", "fp16", "bf16")}


class Role(str, enum.Enum):
    """What a variant is in the comparison."""

    BASELINE = "baseline"  # the plain "before"; accuracy and speedups are relative to it
    CANDIDATE = "candidate"  # the optimization under test
    PEER = "peer"  # what a user would pick instead (e.g. a vendor library); compared, not gated


@dataclass(frozen=True)
class Variant:
    """One implementation of the plugin's operation.

    ``fn`` is called with the case's inputs as keyword arguments and returns a tensor or a tuple of
    tensors. ``needs`` lists what the variant requires (``"cuda"``, ``"triton"``); where a need is not
    met the trial is recorded as skipped with the reason. ``supports`` may refuse individual cases
    (return a reason string) such as a backend that only handles some head dims.

    ``params`` names keyword arguments of ``fn`` with their defaults (plain values: numbers, text,
    true/false) that a config may sweep (``sweep: {triton: {warps: [4, 8]}}``): the run then times, beside
    ``triton`` itself, one variant per value, ``triton[warps=4]`` and ``triton[warps=8]``, in the same
    interleaved rounds.

    ``checked=False`` (peers only) marks a speed-only peer that computes different math, such as exact
    softmax attention beside a linear-attention kernel: it is timed and measured in the same rounds,
    its accuracy is recorded as skipped, and it may be the "fastest peer" a candidate is compared with.
    A candidate is always checked: a wrong kernel never wins.

    ``opt_in=True`` (peers only) runs the variant only where a config's ``variants:`` names it: a study's
    variants (the kernel with one stage left out, say) that a plain run should not time. Its records say
    ``study``, and it is never the fastest peer a candidate is compared with.
    """

    fn: Callable[..., Any]
    role: Role = Role.CANDIDATE
    description: str = ""
    needs: tuple[str, ...] = ()
    supports: Callable[[Case, str], str | None] | None = None
    differentiable: bool = True
    params: Mapping[str, Any] = field(default_factory=dict)
    checked: bool = True
    opt_in: bool = False

    def __post_init__(self) -> None:
        if not self.checked and self.role is not Role.PEER:
            raise ValueError(f"checked=False is for peers only; a {self.role.value} is always accuracy-checked")
        if self.opt_in and self.role is not Role.PEER:
            raise ValueError(f"opt_in=True is for peers only; a {self.role.value} runs in every run")


def baseline(fn: Callable[..., Any], description: str = "", **kw: Any) -> Variant:
    """The reference variant ("before"). Exactly one per plugin."""
    return Variant(fn, Role.BASELINE, description or (fn.__doc__ or "").strip().split("\n")[0], **kw)


def candidate(fn: Callable[..., Any], description: str = "", **kw: Any) -> Variant:
    """A variant under test ("after")."""
    return Variant(fn, Role.CANDIDATE, description or (fn.__doc__ or "").strip().split("\n")[0], **kw)


def peer(fn: Callable[..., Any], description: str = "", **kw: Any) -> Variant:
    """An alternative a user could pick instead; measured alongside, never the thing being judged."""
    return Variant(fn, Role.PEER, description or (fn.__doc__ or "").strip().split("\n")[0], **kw)


@dataclass(frozen=True)
class Arm:
    """One arm of a model-level comparison on the embedded workload (``microscope.workloads``).

    Every arm starts from the same model config, initial weights, data order and seeds; an arm then
    differs by any of: ``model`` (``ModelConfig`` field overrides, e.g. ``{"norm_eps": 1e-3}``),
    ``recipe`` (``TrainRecipe`` field overrides, e.g. ``{"precision": "bf16"}``, ``{"betas": (0.95,
    0.95)}``, ``{"checkpoint_every": 1}``) and ``patch`` (called with the freshly built model before
    training, to swap a module or a swap point such as ``model.set_attention(fn)``).
    ``needs``/``supports`` work as for ``Variant``; ``supports(case, device)`` may refuse a case.

    ``inference_only=True`` marks a change that only acts at inference (a KV cache, a decode kernel):
    the arm does not train but loads the baseline's trained weights of the same seed after its patch,
    so every difference it shows is the change's own, and no time goes on identical training runs.
    Its training records are marked skipped with that reason.

    ``ranks=N`` (N > 1) trains the arm on N processes (gloo on CPU, NCCL on N GPUs; ``microscope.distributed``):
    each rank builds the same model and initial weights, applies ``patch`` (then a module-level function, as
    the ranks are spawned processes), then ``strategy(model, ctx)`` (``ctx`` a ``RankContext``) wraps or shards
    it (DDP with a communication hook, ``fully_shard``, ...), and trains on rows ``rank::N`` of each batch (a
    model-parallel strategy marked so sees the whole batch). ``DISTRIBUTED_STRATEGIES`` holds ready ones built
    on PyTorch's stack (``ddp``, ``ddp_powersgd``, ``ddp_sign``, ``zero2``, ``zero3``, ``zero3_offload``,
    ``tp``, ``pp``, ``ep`` for ``MoE`` layers); a plugin's own is any module-level function.
    The records gain per-rank memory (peak, parameters, optimizer state) and the bytes each rank passed to
    collectives; the trained weights come back for evaluation like any arm's.

    ``calibrate(model, batches)`` (inference-only arms) runs once the trained weights are loaded, with
    ``CALIBRATION_BATCHES`` batches of training-split token ids (B, T) on the run's device, never
    evaluation text: the place for a post-training step that needs the trained model's activations
    (GPTQ's Hessians, activation ranges), which a ``patch`` on the untrained model cannot see.

    ``distill=w`` (0 < w <= 1) trains the arm against the baseline's trained model of the same seed as a
    frozen teacher: the loss is ``(1 - w) * cross entropy + w * T^2 * KL(teacher || student)`` at
    temperature ``distill_temperature`` (Hinton et al.). The baseline trains first; the arm's recorded
    training loss stays the cross entropy, comparable with the other arms'.
    """

    role: Role = Role.CANDIDATE
    description: str = ""
    patch: Callable[[Any], None] | None = None
    model: Mapping[str, Any] = field(default_factory=dict)
    recipe: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    supports: Callable[[Case, str], str | None] | None = None
    inference_only: bool = False
    calibrate: Callable[[Any, Sequence[torch.Tensor]], None] | None = None
    ranks: int = 1
    strategy: Callable[[Any, Any], Any] | None = None
    distill: float = 0.0
    distill_temperature: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"Arm(ranks={self.ranks!r}): the number of processes, a whole number >= 1")
        if self.ranks > 1 and (self.strategy is None or self.inference_only):
            raise ValueError("Arm(ranks>1) trains on several processes: it needs strategy=... (e.g. DDP) and "
                             "cannot be inference_only")
        if not 0.0 <= self.distill <= 1.0 or not self.distill_temperature > 0:
            raise ValueError(f"Arm(distill={self.distill!r}, distill_temperature={self.distill_temperature!r}): "
                             "the teacher's share of the loss lies in [0, 1] and the temperature is > 0")
        if self.distill and (self.role is Role.BASELINE or self.inference_only or self.ranks > 1):
            raise ValueError("Arm(distill=...) learns from the baseline's trained model: a single-process arm "
                             "that trains, not the baseline itself")
        if self.calibrate is not None and not self.inference_only:
            raise ValueError("Arm(calibrate=...) needs inference_only=True: calibration runs on the baseline's "
                             "trained weights, which only an inference-only arm loads")


@dataclass(frozen=True)
class ModelShapes:
    """What one arm of a model-level run computes with, for ``Ablation.precompile_model``: its model config,
    the dtype its layers see (the recipe's autocast, else float32), every distinct ``nn.Linear`` of the model
    as built (before the arm's patch) as (out_features, in_features, has_bias), whether the arm trains, and
    the row counts (tokens per call) of its calls: training batches (an arm that trains), evaluation and
    prefill batches, and decode steps (one token per sequence). A last evaluation batch may hold fewer rows.
    ``check_rows`` are the rows of the causality check on the patched model, which runs in float32 whatever
    the recipe; ``calls()`` lists every (rows, dtype) pair a kernel of the arm sees."""

    model: ModelConfig
    dtype: torch.dtype
    linears: tuple[tuple[int, int, bool], ...]
    rows: tuple[int, ...]
    trains: bool
    check_rows: tuple[int, ...] = ()

    def calls(self) -> tuple[tuple[int, torch.dtype], ...]:
        """Every (rows, dtype) pair the arm's layers are called with: the run's rows in ``dtype``, the check's
        in float32."""
        pairs = [(m, self.dtype) for m in self.rows] + [(m, torch.float32) for m in self.check_rows]
        return tuple(dict.fromkeys(pairs))


@dataclass(frozen=True)
class Figure:
    """One figure of a plugin's own (``Ablation.figures``): its value, unit and which way is better."""

    value: float
    unit: str = ""
    higher_is_better: bool | None = None
    note: str = ""


#: Batches of training tokens an inference-only arm's ``calibrate`` receives.
CALIBRATION_BATCHES = 8
#: Above this many elements a GPU input is drawn on the GPU (see ``randn``).
DEVICE_DRAW_ELEMENTS = 1 << 20


def randn(
    shape: Sequence[int],
    dtype: torch.dtype,
    gen: torch.Generator,
    device: str | torch.device,
    scale: float = 1.0,
) -> torch.Tensor:
    """Seeded normal tensor: drawn in float32 on the CPU generator, then cast and moved.

    Drawing on the CPU makes the inputs identical on every device, so a GPU run and a CPU run of the
    same seed see the same numbers. A GPU tensor of more than ``DEVICE_DRAW_ELEMENTS`` elements (a
    benchmark shape: 4-17 M elements took ~50 ms a tensor on the H200 host's CPU, for every tensor of every
    input set) is drawn on the GPU instead, from a generator seeded by the CPU generator: the same numbers on
    every run and GPU of the seed, not the CPU's.
    """
    size = math.prod(shape)
    if size > DEVICE_DRAW_ELEMENTS and torch.device(device).type == "cuda":
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        on_device = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(tuple(shape), generator=on_device, device=device, dtype=torch.float32) * scale).to(dtype)
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def call_as_timed(fn: Callable[..., Any], inputs: Mapping[str, Any], grad_inputs: Sequence[str] = ()) -> Any:
    """One call of ``fn`` the way the harness calls a variant: forward only under ``torch.no_grad()`` (every
    forward-only check and timed call), or, with ``grad_inputs``, those inputs requiring gradients and a
    backward through every output. torch.compile keeps one graph per way (grad mode is in its guards), so
    a ``precompile`` that warms a compiled peer calls it once per way the run uses."""
    if not grad_inputs:
        with torch.no_grad():
            return fn(**inputs)
    args = {k: (v.detach().requires_grad_(True) if k in grad_inputs else v) for k, v in inputs.items()}
    out = fn(**args)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(o, torch.Tensor) and o.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return out


def warm_ways(shard: tuple[int, int], backward: bool) -> tuple[bool, ...]:
    """The ways (True: with gradients) in which precompile shard ``shard`` warms a compiled peer with
    ``call_as_timed``: with gradients in shard 0 when the run checks or times gradients, forward only in
    shard ``shard[1] // 2``, so a case's two graphs compile in two processes."""
    index, count = shard
    return (True,) * (backward and index == 0) + (False,) * (index == count // 2)


class Ablation:
    """Base class of every plugin. Subclass it, fill in the class attributes, decorate with ``register``.

    Operator level (inputs -> outputs): ``variants`` (exactly one baseline), ``cases``, ``tolerance``
    (keyed by dtype name) and ``inputs``; optional ``grad_inputs``, ``flops``, ``bytes``, ``reference``.

    Model level (the same change inside the embedded model, trained and evaluated): ``arms``, exactly
    one with ``Role.BASELINE``. A plugin may have both levels (flash_attn does); a config picks one
    with ``level:``.
    """

    #: Set by ``register``.
    name: ClassVar[str] = ""
    variants: ClassVar[Mapping[str, Variant]] = {}
    #: The default case grid; a config's ``cases:`` may narrow or replace its axes.
    cases: ClassVar[Sequence[Case]] = ()
    #: Per dtype name; ``"*"`` is the fallback.
    tolerance: ClassVar[Mapping[str, Tolerance]] = {}
    #: Model level: arm name -> how the embedded model or its training differs.
    arms: ClassVar[Mapping[str, Arm]] = {}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
        """Tensors for one case, drawn from the harness's seeded generator (use ``randn``).

        Return plain tensors (and plain values such as a flag or a group size), not objects holding
        tensors: timed calls rotate several seeded input sets through each variant's buffers, which
        catches a variant that memoizes its answer, and only plain tensors can be rotated.
        """
        raise NotImplementedError(f"plugin {self.name!r} must define inputs(case, gen, device)")

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        """Names of the inputs that receive gradients in the backward checks. Default: none."""
        return ()

    def flops(self, case: Case, backward: bool = False) -> float | None:
        """Floating-point operations of one call (forward, or forward+backward), for TFLOP/s."""
        return None

    def bytes(self, case: Case, backward: bool = False) -> float | None:
        """Minimum bytes one call must move to and from memory, for GB/s and roofline."""
        return None

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """Optional: compile, without running or timing, the GPU kernels ``case`` will use (with their
        backward kernels where ``backward``: the run checks or times gradients), only the
        ``shard[0]``-th of ``shard[1]`` parts (e.g. autotuning candidate ``i`` where ``i % shard[1] ==
        shard[0]``). Before a GPU run the harness calls every shard in its own process, so candidates
        compile side by side into Triton's on-disk cache rather than one by one in the first call. The
        numbering turns with the case (case ``j``'s shard 0 runs in process ``j mod shard[1]``), so work done
        once per case under a fixed ``shard[0]`` (a torch.compile warm-up) spreads over the processes. Warm a
        compiled peer with ``call_as_timed`` once per way the run calls it, in the shards ``warm_ways`` names.
        ``MICROSCOPE_PRECOMPILE_WORKERS=0`` skips the step. Default: nothing to compile."""

    def precompile_model(self, arm: str, shapes: ModelShapes, device: str, shard: tuple[int, int]) -> None:
        """Optional, model level: as ``precompile``, for the kernels arm ``arm`` will run inside the model
        (``shapes``: its Linears, dtype and row counts), only the ``shard[0]``-th of ``shard[1]`` parts. A
        model's Linears come in several shapes, each autotuned at its first call: compiled one by one there,
        inside a seed's training or evaluation, the candidates can take minutes. Default: nothing to compile."""

    def figures(self, case: Case, inputs: Mapping[str, Any], device: str) -> Mapping[str, Mapping[str, Figure]]:
        """Optional: figures of the plugin's own for one case that no dimension measures (an LSH
        kernel's recall of the heaviest keys, a paged cache's admitted sequences), as ``{variant: {metric:
        Figure}}``. Called once per case on the accuracy inputs; each figure becomes a record of the
        ``figures`` dimension, shown beside the others with its ratio to the baseline's (untested: one
        value per case). A figure for a variant the run does not include is left out. Default: none."""
        return {}

    def reference(self, inputs: Mapping[str, torch.Tensor]) -> Any:
        """The ground truth: by default the baseline evaluated on float64 copies of the inputs."""
        return self.baseline_variant()[1].fn(**inputs)

    # -- conveniences the harness uses; plugins rarely override these --------------------------
    def tolerance_for(self, case: Case) -> Tolerance:
        key = case.get("dtype", "fp32")
        if key in self.tolerance:
            return self.tolerance[key]
        if "*" in self.tolerance:
            return self.tolerance["*"]
        raise KeyError(f"plugin {self.name!r} declares no tolerance for dtype {key!r} (and no '*' fallback)")

    def baseline_variant(self) -> tuple[str, Variant]:
        found = [(n, v) for n, v in self.variants.items() if v.role is Role.BASELINE]
        if len(found) != 1:
            raise TypeError(f"plugin {self.name!r} must declare exactly one baseline variant, found {len(found)}")
        return found[0]

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels this plugin supports: ``"operator"`` (variants) and/or ``"model"`` (arms)."""
        return tuple(level for level, has in (("operator", self.variants), ("model", self.arms)) if has)

    def iter_variants(self) -> Iterator[tuple[str, Variant]]:
        """Baseline first, then candidates, then peers: the order tables are printed in."""
        order = {Role.BASELINE: 0, Role.CANDIDATE: 1, Role.PEER: 2}
        yield from sorted(self.variants.items(), key=lambda nv: order[nv[1].role])


#: Plugins registered by ``@register`` as their modules are imported; ``microscope.registry`` reads it.
_REGISTERED: dict[str, tuple[type[Ablation], str]] = {}


@dataclass
class RegistrationError(Exception):
    """Two plugins claim the same name."""

    name: str
    first: str
    second: str
    message: str = field(init=False)

    def __post_init__(self) -> None:
        self.message = (
            f"two plugins are registered as {self.name!r}: {self.first} and {self.second}. "
            f"Rename one of them (the name is the argument of @register)."
        )

    def __str__(self) -> str:
        return self.message


def register(name: str) -> Callable[[type[Ablation]], type[Ablation]]:
    """Class decorator: make a plugin known to microscope under ``name``."""
    if not name.isidentifier():
        raise ValueError(f"plugin name {name!r} must be a Python identifier (letters, digits, underscores)")

    def wrap(cls: type[Ablation]) -> type[Ablation]:
        if not (isinstance(cls, type) and issubclass(cls, Ablation)):
            raise TypeError(f"@register({name!r}) decorates {cls!r}, which is not a subclass of Ablation")
        origin = f"{cls.__module__}.{cls.__qualname__}"
        if name in _REGISTERED and _REGISTERED[name][1] != origin:
            raise RegistrationError(name, _REGISTERED[name][1], origin)
        cls.name = name
        if not cls.variants and not cls.arms:
            raise TypeError(f"plugin {name!r} declares neither variants (operator level) nor arms (model level)")
        if cls.variants:
            cls.baseline_variant(cls)  # type: ignore[arg-type]  # validates exactly one baseline
        if cls.arms and sum(a.role is Role.BASELINE for a in cls.arms.values()) != 1:
            raise TypeError(f"plugin {name!r} must declare exactly one baseline arm")
        if any(a.inference_only and a.role is Role.BASELINE for a in cls.arms.values()):
            raise TypeError(f"plugin {name!r}: the baseline arm trains the weights that inference_only arms "
                            "reuse, so it cannot be inference_only itself")
        _REGISTERED[name] = (cls, origin)
        return cls

    return wrap


def __getattr__(name: str) -> Any:
    """``DISTRIBUTED_STRATEGIES`` and ``RankContext`` load ``microscope.distributed`` (FSDP, device meshes:
    ~0.8 s of imports) only when a plugin asks for them."""
    if name in ("DISTRIBUTED_STRATEGIES", "RankContext"):
        import microscope.distributed as distributed

        return distributed.STRATEGIES if name == "DISTRIBUTED_STRATEGIES" else distributed.RankContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
