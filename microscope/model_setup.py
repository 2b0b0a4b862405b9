"""What one model-level trial trains with: seeds, model config, recipe, and the data behind it.

Kept apart from the runner so that the rule of every model-level comparison lives in one small place:
all arms of seed index ``k`` start from the same weights, see the same data order and use the same loop
seed; an arm differs only by its own ``model``/``recipe`` overrides and its ``patch``.

Override order (later wins): the workload profile, the config's ``workload:`` section (``steps``,
``batch_size``, then ``workload.model``/``.recipe``), the arm's ``model``/``recipe``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from microscope.api import Arm, ModelShapes
from microscope.config import WorkloadConfig
from microscope.model_measures import LEAK_SEQ_LEN
from microscope.seeding import derive_seed
from microscope.workloads import (
    PROBE_BATCH,
    AssociativeRecall,
    Corpus,
    ModelConfig,
    Profile,
    TrainRecipe,
    Transformer,
    get_profile,
    load_corpus,
)
from microscope.workloads.train import PRECISIONS

__all__ = ["TrialSeeds", "TrialSetup", "WorkloadData", "autocast", "model_shapes", "param_checksum", "trial_setup"]


@dataclass(frozen=True)
class TrialSeeds:
    """The seeds of seed index ``index``; they depend on the run seed and the index only, never on the arm.

    Not on the plugin either: the baseline arm of two plugins on the same workload is the very same run,
    so baselines can be compared across configs.
    """

    index: int
    trial: int  # what records carry as ``seed``
    init: int  # build_model's weight initialisation
    data: int  # training windows (WindowSampler) or recall sequences
    loop: int  # TrainRecipe.seed: dropout and other randomness inside the training loop
    eval: int  # recall evaluation sequences

    @classmethod
    def of(cls, run_seed: int, index: int) -> TrialSeeds:
        trial = derive_seed(run_seed, "model-trial", index)
        return cls(index, trial, *(derive_seed(trial, key) for key in ("init", "data", "loop", "eval")))


@dataclass(frozen=True)
class TrialSetup:
    """Model config, recipe and evaluation budget of one arm (the seeds are already in the recipe)."""

    profile: Profile
    model: ModelConfig
    recipe: TrainRecipe
    eval_tokens: int
    eval_batch_size: int

    @property
    def context(self) -> int:
        return self.model.context


def trial_setup(workload: WorkloadConfig, arm: Arm, seeds: TrialSeeds) -> TrialSetup:
    """Profile + workload overrides + the arm's overrides, with the loop seed of ``seeds``."""
    profile = get_profile(workload.profile)
    model = dataclasses.replace(profile.model, **{**workload.model, **arm.model})
    sizes = {key: value for key, value in (("steps", workload.steps), ("batch_size", workload.batch_size))
             if value is not None}
    recipe = dataclasses.replace(profile.recipe, **{**sizes, **workload.recipe, **arm.recipe, "seed": seeds.loop})
    eval_tokens = workload.eval_tokens if workload.eval_tokens is not None else profile.eval_tokens
    rows = workload.eval_batch_size if workload.eval_batch_size is not None else profile.eval_batch_size
    return TrialSetup(profile, model, recipe, eval_tokens, rows)


def model_shapes(workload: WorkloadConfig, arm: Arm) -> ModelShapes:
    """What ``arm`` will compute with (``Ablation.precompile_model``): its model's Linears, read off a model
    built on the meta device (no memory, no weights), the autocast dtype, and the rows of its calls:
    training batches (an arm that trains), evaluation and prefill batches (eval batch x context), the
    decode prompt (its first half) and decode steps (one row per sequence)."""
    setup = trial_setup(workload, arm, TrialSeeds.of(0, 0))
    with torch.device("meta"):
        model = Transformer(setup.model)
    linears = tuple(dict.fromkeys((m.out_features, m.in_features, m.bias is not None)
                                  for m in model.modules() if isinstance(m, nn.Linear)))
    rows = {setup.eval_batch_size * setup.context, setup.eval_batch_size * max(1, setup.context // 2),
            setup.eval_batch_size}
    if not arm.inference_only:
        rows.add(setup.recipe.batch_size * setup.context)
    dtype = PRECISIONS[setup.recipe.precision] or torch.float32
    check_rows = (PROBE_BATCH * min(LEAK_SEQ_LEN, setup.context),)
    return ModelShapes(setup.model, dtype, linears, tuple(sorted(rows)), trains=not arm.inference_only,
                       check_rows=check_rows)


@dataclass(frozen=True)
class WorkloadData:
    """The corpus (task ``lm``) or the synthetic task (``recall``), and the hash records carry as ``corpus_hash``.

    The recall task reads no corpus; its identity is the generator's definition, so two recall runs
    compare and a recall run never compares with a corpus run.
    """

    task: str
    corpus: Corpus | None
    recall: AssociativeRecall | None
    sha256: str
    description: dict[str, Any]

    @classmethod
    def load(cls, workload: WorkloadConfig) -> WorkloadData:
        if workload.task == "recall":
            recall = AssociativeRecall()
            ident = f"microscope-associative-recall-v1 key_len={recall.key_len}"
            sha = hashlib.sha256(ident.encode()).hexdigest()
            return cls("recall", None, recall, sha, {"kind": "associative_recall", "key_len": recall.key_len,
                                                     "sha256": sha})
        spec = dataclasses.replace(get_profile(workload.profile).corpus, **workload.corpus)
        corpus = load_corpus(spec)
        return cls("lm", corpus, None, corpus.sha256, corpus.describe())


def param_checksum(model: nn.Module) -> str:
    """SHA-256 over every parameter's name, shape and bytes: equal iff the weights are bitwise equal."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        data = param.detach().to("cpu").contiguous()
        h.update(f"{name}\0{tuple(data.shape)}\0{data.dtype}\0".encode())
        h.update(data.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def autocast(device: str, precision: str) -> AbstractContextManager[Any]:
    """The recipe's autocast for inference-side measurements (evaluation already takes ``precision``)."""
    dtype = PRECISIONS[precision]
    return torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext()

