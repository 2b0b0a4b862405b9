"""Model-level measurements: turn a trained model and its ``TrainResult`` into named, recorded numbers.

Each function returns ``Measurement``s (value = the scalar; details = the arrays behind it). The metric
names and dimensions are chosen for ``microscope.stats.metric_kind``:

* ``accuracy``: model accuracy, compared *paired per token* (``details.per_token``) or per recall
  example (``details.per_example``); ``future_leak`` carries a ``passed`` flag, so it is a pass/fail check;
* ``stability`` and ``generalization``: one value per seed, compared as distributions over seeds;
* ``throughput``: ``*_tokens_per_s`` rates (never ``*_ms``, which would be read as latency);
* ``memory``: bytes (``*_peak_bytes``, ``weight_bytes``, ``saved_activation_bytes``).

``STAGES`` lists, per stage of a trial, the metrics it produces, so that a stage that fails can record
every metric it owed as failed, and a report never silently misses a row.
"""

from __future__ import annotations

import gc
import hashlib
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from microscope.measures.memory import LiveTensorBytes, saved_for_backward_bytes
from microscope.seeding import derive_seed
from microscope.stats.distributions import grad_norm_cv
from microscope.workloads import (
    AssociativeRecall,
    EvalResult,
    TrainRecipe,
    TrainResult,
    Transformer,
    decode_throughput,
    generate_greedy,
    lm_loss,
    peak_memory_inference,
    peak_memory_train_step,
    prefill_throughput,
    score_through_cache,
)
from microscope.workloads.memory import PeakReading

__all__ = ["LEAK_NOISE_FACTOR", "LEAK_SEQ_LEN", "LEAK_TOLERANCE", "LONGER_CONTEXTS", "RECALL_EXAMPLES", "Measurement",
           "stage_metrics"]

#: Largest change of earlier logits, when only later tokens change, that still counts as causal.
#: A causal model gives exactly 0 (the earlier positions never read the later tokens).
LEAK_TOLERANCE = 1e-6
#: A model whose repeated forward of the same tokens drifts (atomic split-K sums) may change its earlier logits by
#: this many times that drift before the change counts as a leak; a real leak moves them by orders more.
LEAK_NOISE_FACTOR = 4.0
#: Tokens per sequence of the check (at most the model's context); it runs in float32, without autocast.
LEAK_SEQ_LEN = 32
#: Multiples of the training context the generalization dimension evaluates at (``workload.longer_contexts``).
LONGER_CONTEXTS = (2, 4)
#: Fresh recall sequences scored per context length (chance accuracy is 10%).
RECALL_EXAMPLES = 256

_LOWER, _HIGHER = False, True


@dataclass
class Measurement:
    """One record's worth: dimension, metric, value and the arrays behind it."""

    dimension: str
    metric: str
    value: float | None
    unit: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    passed: bool | None = None
    reason: str | None = None


def _m(dimension: str, metric: str, value: float | None, unit: str, better: bool, **details: Any) -> Measurement:
    return Measurement(dimension, metric, value, unit, {"higher_is_better": better, **details})


def stage_metrics(task: str, fp16: bool) -> dict[str, list[tuple[str, str]]]:
    """Stage -> the (dimension, metric) pairs it records, for task ``lm`` or ``recall``."""
    stability = ["final_loss", "steps_to_baseline_loss", "grad_norm_cv", "grad_norm_max", "loss_spikes",
                 "nonfinite_steps", "update_ratio_max"] + (["loss_scale_changes"] if fp16 else [])
    if task == "recall":
        accuracy = ["recall_loss", "recall_acc"]
        general = ["recall_loss_2x", "recall_loss_4x", "recall_acc_2x", "recall_acc_4x"]
    else:
        accuracy = ["val_loss", "val_ppl", "val_token_acc"]
        general = ["ood_loss", "ood_gap", "val_loss_2x", "val_loss_4x"]
    return {
        "check": [("accuracy", "future_leak")],
        "train": [("stability", m) for m in stability] + [("throughput", "train_tokens_per_s")],
        "evaluate": [("accuracy", m) for m in accuracy] + [("generalization", m) for m in general],
        "generation": [("accuracy", "decode_loss"), ("accuracy", "decode_ppl"), ("accuracy", "greedy_agreement"),
                       ("memory", "kv_cache_bytes")],
        "inference": [("throughput", "prefill_tokens_per_s"), ("throughput", "decode_tokens_per_s")],
        "memory": [("memory", "weight_bytes"), ("memory", "saved_activation_bytes"),
                   ("memory", "train_step_peak_bytes"), ("memory", "inference_peak_bytes")],
    }


# -- stability --------------------------------------------------------------------------------------


def tail_window(steps: int) -> int:
    """Steps averaged for the final loss (the last 10%, at least one)."""
    return max(1, steps // 10)


def smoothed_loss(loss: np.ndarray) -> np.ndarray:
    """Trailing mean over ``tail_window`` steps (NaN before the window fills); its last value is the final loss."""
    w = tail_window(len(loss))
    out = np.full(len(loss), np.nan)
    for t in range(w - 1, len(loss)):
        out[t] = np.mean(loss[t - w + 1 : t + 1])
    return out


def first_nonfinite(loss: np.ndarray) -> int | None:
    """Index of the first step whose loss is NaN or Inf, or None."""
    bad = np.flatnonzero(~np.isfinite(loss))
    return int(bad[0]) if bad.size else None


def stability(result: TrainResult, target: float | None, warmup: int, fp16: bool) -> list[Measurement]:
    """Loss curve, convergence speed, gradient statistics, spikes, NaN/Inf steps, update ratios, AMP events.

    ``target`` is the baseline's final loss of the same seed (None when the baseline has none):
    ``steps_to_baseline_loss`` is the first step at which this arm's smoothed loss reaches it.
    """
    loss, steps = result.loss, len(result.loss)
    w = tail_window(steps)
    smooth = smoothed_loss(loss)
    diverged = first_nonfinite(loss)
    final = Measurement("stability", "final_loss", None if diverged is not None else float(smooth[-1]), "nats",
                        {"higher_is_better": _LOWER, "curve": loss.tolist(), "window": w,
                         "definition": f"mean loss of the last {w} of {steps} steps"})
    if diverged is not None:
        final.reason = f"training diverged: the loss is non-finite from step {diverged}"
    if target is None:
        reach = Measurement("stability", "steps_to_baseline_loss", None, "steps",
                            reason="no baseline final loss for this seed (the baseline failed or diverged)")
    else:
        hit = np.flatnonzero(smooth <= target)
        reach = _m("stability", "steps_to_baseline_loss", int(hit[0]) + 1 if hit.size else steps, "steps", _LOWER,
                   target=target, reached=bool(hit.size), window=w,
                   definition=f"first step whose trailing {w}-step mean loss is <= the baseline's final loss "
                              "(the step count when never reached: a lower bound)")
    gn = result.grad_norm
    skip = warmup if steps > warmup + 1 else 0
    finite_gn = gn[np.isfinite(gn)]
    layers = {name: result.layer_grad_norm[:, i].tolist() for i, name in enumerate(result.layer_names)}
    spikes = result.spikes
    bad_steps = (result.nan_count + result.inf_count > 0) | ~np.isfinite(loss)
    ratios = result.update_ratio[np.isfinite(result.update_ratio)]
    out = [
        final,
        reach,
        _m("stability", "grad_norm_cv", grad_norm_cv(gn[skip:]), "ratio", _LOWER, after_step=skip,
           definition="std/mean of the global grad norm (before clipping) over the steps after warm-up"),
        _m("stability", "grad_norm_max", float(finite_gn.max()) if finite_gn.size else math.nan, "norm", _LOWER,
           curve=gn.tolist(), layers=layers),
        _m("stability", "loss_spikes", int(spikes.sum()), "count", _LOWER, steps=np.flatnonzero(spikes).tolist(),
           window=result.spike_window, k=result.spike_k,
           definition="loss > median + k * MAD of the previous window (workloads.stability.loss_spikes)"),
        _m("stability", "nonfinite_steps", int(bad_steps.sum()), "steps", _LOWER,
           nan_elements=int(result.nan_count.sum()), inf_elements=int(result.inf_count.sum()),
           first=int(np.flatnonzero(bad_steps)[0]) if bad_steps.any() else None,
           definition="steps whose loss or gradients held a NaN or Inf"),
        _m("stability", "update_ratio_max", float(ratios.max()) if ratios.size else math.nan, "ratio", _LOWER,
           curve=result.update_ratio.tolist(),
           layers={name: float(result.layer_update_ratio[-1, i]) for i, name in enumerate(result.layer_names)},
           definition="max over steps of ||theta_new - theta_old|| / ||theta_old||"),
    ]
    if fp16:
        scales = result.loss_scale
        scaler = bool(np.isfinite(scales).any())
        changes = int((np.diff(scales[np.isfinite(scales)]) != 0).sum()) if scaler else 0
        out.append(_m("stability", "loss_scale_changes", changes, "count", _LOWER, scaler=scaler,
                      skipped_steps=int(result.skipped.sum()), curve=scales.tolist() if scaler else [],
                      definition="times the GradScaler's scale changed between steps (0 without a scaler)"))
    return out


def train_speed(result: TrainResult, notes: list[str]) -> Measurement:
    """Training tokens/s over the steps after the first 10% (allocator and cache warm-up)."""
    skip = min(max(1, len(result.loss) // 10), len(result.loss) - 1)
    samples = (result.tokens[skip:] / result.step_time[skip:]).tolist()
    return _m("throughput", "train_tokens_per_s", result.tokens_per_s(skip), "tokens/s", _HIGHER,
              samples=samples, warmup_steps=skip, notes=notes,
              definition="tokens of the timed steps / their summed step time (forward, backward, optimizer)")


# -- accuracy and generalization --------------------------------------------------------------------


def _span_sha(tokens: torch.Tensor, result: EvalResult) -> str:
    """SHA-256 of the token span an evaluation scored, so records show which text each one used."""
    span = tokens[: result.n_windows * result.seq_len + 1].to(torch.int32).numpy()
    return hashlib.sha256(span.tobytes()).hexdigest()


def _eval_details(result: EvalResult, split: str, tokens: torch.Tensor) -> dict[str, Any]:
    return {"split": split, "seq_len": result.seq_len, "n_tokens": result.n_tokens,
            "n_windows": result.n_windows, "data_sha256": _span_sha(tokens, result)}


def lm_evaluation(evals: dict[str, EvalResult], val: torch.Tensor, ood: torch.Tensor,
                  margin: float) -> list[Measurement]:
    """Validation loss/perplexity/accuracy (paired per token), OOD loss, and the 2x/4x-context losses that
    were evaluated."""
    v = evals["val@1x"]
    o = evals["ood@1x"]
    vd = _eval_details(v, "val", val)
    out = [
        _m("accuracy", "val_loss", v.loss, "nats", _LOWER, per_token=v.token_losses.tolist(), margin=margin, **vd),
        _m("accuracy", "val_ppl", v.perplexity, "", _LOWER, margin=v.perplexity * math.expm1(margin),
           definition="exp(val_loss)", **vd),  # the loss margin, as perplexity
        _m("accuracy", "val_token_acc", v.accuracy, "fraction", _HIGHER,
           per_token=v.token_correct.astype(np.float32).tolist(), **vd),
        _m("generalization", "ood_loss", o.loss, "nats", _LOWER, per_token=o.token_losses.tolist(),
           **_eval_details(o, "ood", ood)),
        _m("generalization", "ood_gap", o.loss - v.loss, "nats", _LOWER, ood_loss=o.loss, val_loss=v.loss,
           definition="out-of-domain loss minus in-domain validation loss, both at the training context"),
    ]
    for mult in LONGER_CONTEXTS:
        r = evals.get(f"val@{mult}x")
        if r is None:
            continue
        out.append(_m("generalization", f"val_loss_{mult}x", r.loss, "nats", _LOWER,
                      per_token=r.token_losses.tolist(), multiplier=mult, **_eval_details(r, "val", val)))
    return out


@torch.no_grad()
def recall_scores(model: Transformer, task: AssociativeRecall, context: int, seed: int,
                  n_examples: int = RECALL_EXAMPLES, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-example answer loss and correctness on fresh recall sequences (same sequences for every arm).

    The per-example arrays (not ``recall_accuracy``'s single fraction) let the statistics pair arms
    example by example.
    """
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(derive_seed(seed, "recall-eval", context))
    was_training = model.training
    model.eval()
    losses, correct = [], []
    try:
        for start in range(0, n_examples, batch_size):
            batch = task.sample(min(batch_size, n_examples - start), context, gen)
            logits = model(batch.x.to(dev))[:, -1].float().cpu()
            losses.append(F.cross_entropy(logits, batch.answer, reduction="none"))
            correct.append(logits.argmax(-1) == batch.answer)
    finally:
        model.train(was_training)
    return torch.cat(losses).numpy(), torch.cat(correct).numpy().astype(np.float32)


def recall_evaluation(model: Transformer, task: AssociativeRecall, context: int, seed: int,
                      margin: float, longer: tuple[int, ...] = LONGER_CONTEXTS) -> list[Measurement]:
    """Recall loss/accuracy at the trained context (paired per example) and at the ``longer`` multiples."""
    out = []
    for mult in (1, *longer):
        length = context * mult
        losses, correct = recall_scores(model, task, length, seed)
        dim, suffix = ("accuracy", "") if mult == 1 else ("generalization", f"_{mult}x")
        info = {"seq_len": length, "n_examples": len(losses), "n_pairs": task.max_pairs(length),
                "multiplier": mult}
        loss_extra = {"margin": margin} if mult == 1 else {}
        out.append(_m(dim, f"recall_loss{suffix}", float(losses.mean()), "nats", _LOWER,
                      per_example=losses.tolist(), **loss_extra, **info))
        out.append(_m(dim, f"recall_acc{suffix}", float(correct.mean()), "fraction", _HIGHER,
                      per_example=correct.tolist(), **info))
    return out


# -- generation through the KV cache ----------------------------------------------------------------


def generation(model: Transformer, prompt: torch.Tensor, new_tokens: int, baseline_tokens: torch.Tensor | None,
               margin: float, is_baseline: bool = False) -> tuple[list[Measurement], torch.Tensor]:
    """What the decode path does to the text: the only place a KV-cache change shows in accuracy.

    ``prompt`` (B, S): the second half is scored teacher-forced through the cache after a prefill of
    the first half (``decode_loss``, paired per token, and its perplexity); from the first half,
    ``new_tokens`` greedy tokens are generated and compared position by position with the baseline's
    greedy tokens of the same seed (``greedy_agreement``; the baseline agrees with itself). Returns the
    measurements and this arm's greedy tokens (``is_baseline``: they are the reference).
    """
    half = max(1, prompt.shape[1] // 2)
    scored = score_through_cache(model, prompt, half)
    cache = scored.cache
    where = {"prompt_shape": list(prompt.shape), "prefill_len": half, "n_tokens": int(scored.token_losses.size)}
    greedy = generate_greedy(model, prompt[:, :half], new_tokens).cpu()
    if is_baseline:
        baseline_tokens = greedy
    if baseline_tokens is None:
        agreement = Measurement("accuracy", "greedy_agreement", None,
                                reason="no greedy tokens from this seed's baseline to compare with (it failed)")
    else:
        same = (greedy == baseline_tokens).numpy()
        diverged = [int(np.flatnonzero(~row)[0]) if (~row).any() else None for row in same]
        agreement = _m("accuracy", "greedy_agreement", float(same.mean()), "fraction", _HIGHER,
                       per_token=same.astype(np.float32).ravel().tolist(), first_divergence=diverged,
                       relative_to_baseline=True,
                       new_tokens=new_tokens, prompt_shape=[prompt.shape[0], half],
                       definition="fraction of greedy tokens equal to the baseline's at the same position "
                                  "(after a first divergence the two continue from different text)")
    out = [
        _m("accuracy", "decode_loss", scored.loss, "nats", _LOWER, per_token=scored.token_losses.tolist(),
           margin=margin, **where,
           definition="cross-entropy of the prompt's second half, fed one cached decode step at a time"),
        _m("accuracy", "decode_ppl", math.exp(scored.loss), "", _LOWER, definition="exp(decode_loss)",
           margin=math.exp(scored.loss) * math.expm1(margin), **where),  # the loss margin, as perplexity
        agreement,
        _m("memory", "kv_cache_bytes", cache.nbytes(), "bytes", _LOWER, cache=type(cache).__name__,
           cached_tokens=cache.seq_len, rows=prompt.shape[0],
           definition="bytes the KV cache holds after caching the whole prompt (data, scales and spare capacity)"),
    ]
    return out, greedy


# -- inference speed and memory ---------------------------------------------------------------------


def inference_speed(model: Transformer, prompt: torch.Tensor, decode_tokens: int,
                    notes: list[str]) -> list[Measurement]:
    """Prefill tokens/s of ``prompt`` (B, S) and greedy decode tokens/s after a prefill of its first half."""
    # decode steps are launch-bound and short: 10 repetitions, so one hiccup cannot move the median
    pre = prefill_throughput(model, prompt, repeats=10, warmup=2)
    short = prompt[:, : max(1, prompt.shape[1] // 2)]
    dec = decode_throughput(model, short, decode_tokens, repeats=10, warmup=2)
    return [
        _m("throughput", "prefill_tokens_per_s", pre.tokens_per_s, "tokens/s", _HIGHER, samples=pre.samples,
           tokens=pre.tokens, prompt_shape=list(prompt.shape), notes=notes),
        _m("throughput", "decode_tokens_per_s", dec.tokens_per_s, "tokens/s", _HIGHER, samples=dec.samples,
           tokens=dec.tokens, prompt_shape=list(short.shape), new_tokens=decode_tokens, notes=notes),
    ]


@contextmanager
def live_tensor_peak() -> Iterator[PeakReading]:
    """CPU peak probe for ``workloads.memory``: bytes of tensors created inside the block (``LiveTensorBytes``)."""
    reading = PeakReading()
    gc.collect()
    with LiveTensorBytes() as tracker:
        yield reading
    reading.peak_bytes = int(tracker.peak)


_METHODS = {
    "cuda": "cuda_allocator_peak: torch.cuda.max_memory_allocated over the region, absolute "
            "(weights and optimizer state included)",
    "cpu": "cpu_live_tensor_bytes: bytes of the tensors created during the region (weights, optimizer state "
           "and inputs made before it are not counted)",
}


def weight_bytes(model: Transformer) -> int:
    """Bytes of every parameter and buffer the model holds: its weights in whatever form they are stored
    (a quantized Linear's int8 or packed 4-bit values and their scales count, a float copy it dropped does not)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}  # shared tensors count once
    return sum(t.numel() * t.element_size() for t in tensors.values())


def saved_activation_bytes(model: Transformer, batch: tuple[torch.Tensor, torch.Tensor],
                           precision_ctx: AbstractContextManager[Any]) -> int:
    """What a training forward (and its loss) keeps for the backward, parameters excluded: the same on every
    device, where a step's peak also holds weights, gradients and optimizer state. Checkpointed blocks
    count what checkpointing keeps (their inputs), not what they recompute."""
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in batch)
    model.train()

    def forward() -> torch.Tensor:
        with precision_ctx:
            logits = model(x)
        return lm_loss(logits, y)

    return saved_for_backward_bytes(forward, exclude=[*model.parameters(), *model.buffers()])


def memory(model: Transformer, batch: tuple[torch.Tensor, torch.Tensor], recipe: TrainRecipe, prompt: torch.Tensor,
           decode_tokens: int, device: str, precision_ctx: AbstractContextManager[Any],
           train_step: bool = True) -> list[Measurement]:
    """The weights' bytes, the peak bytes of inference (prefill + decode, under the recipe's autocast), then
    of one train step (left out with ``train_step=False``: an arm that only changes inference).

    The train step trains ``model`` in place, so it comes last.
    """
    probe = live_tensor_peak if device == "cpu" else None
    method = _METHODS["cpu" if device == "cpu" else "cuda"]
    measured = [_m("memory", "weight_bytes", weight_bytes(model), "bytes", _LOWER,
                   definition="bytes of the model's parameters and buffers")]
    with precision_ctx:
        infer = peak_memory_inference(model, prompt, decode_tokens, probe=probe)
    measured.append(_m("memory", "inference_peak_bytes", infer, "bytes", _LOWER, method=method,
                       prompt_shape=list(prompt.shape), new_tokens=decode_tokens))
    if train_step:
        measured.append(_m("memory", "saved_activation_bytes", saved_activation_bytes(model, batch, precision_ctx),
                           "bytes", _LOWER, batch_shape=list(batch[0].shape), precision=recipe.precision,
                           checkpoint_every=recipe.checkpoint_every,
                           definition="bytes autograd keeps from one training forward and loss for the "
                                      "backward, the model's parameters excluded: the activation memory"))
        step = peak_memory_train_step(model, batch, recipe, probe=probe)
        measured.append(_m("memory", "train_step_peak_bytes", step, "bytes", _LOWER, method=method,
                           batch_shape=list(batch[0].shape), precision=recipe.precision,
                           checkpoint_every=recipe.checkpoint_every))
    return measured
