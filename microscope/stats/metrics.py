"""What a metric is: its kind (which test the comparison table gives it), its direction of improvement,
and the verdict words every layer shares (the statistics engine, ``compare``, the reports, the gates).
"""

from __future__ import annotations

__all__ = ["FIGURES", "INTERPRETER_TIMING", "MEMORY_BAND", "NOT_JUDGED", "ONE_TRAINING_RUN", "SIGNIFICANT_VERDICTS",
           "SPEED_ONLY", "VS_BASELINE", "VS_BEST_PEER", "VS_CONTRAST", "higher_is_better", "memory_verdict",
           "metric_kind"]

#: Relative peak-memory difference below which two peaks are "same": a CUDA allocator peak moves by a
#: few blocks with the allocator's history.
MEMORY_BAND = 0.001
#: Verdicts that call a difference (the one list: the engine's, compare's and the reports' "significant").
SIGNIFICANT_VERDICTS = frozenset({"faster", "slower", "better", "worse", "higher", "lower", "less", "more"})
#: The verdict of a speed or memory row whose variant fails accuracy in that case.
NOT_JUDGED = "not judged"
#: ``vs`` column: what the candidate is compared with (the baseline, the fastest correct peer of the case,
#: or another variant named by the config's ``stats.contrasts``).
VS_BASELINE, VS_BEST_PEER, VS_CONTRAST = "baseline", "best_peer", "contrast"
INTERPRETER_TIMING = "not gated: interpreter timing"
#: The accuracy record of a ``Variant(checked=False)`` peer.
SPEED_ONLY = "speed only: a peer that computes different math (checked=False), timed but not accuracy-checked"
#: The dimension of a plugin's own figures (``Ablation.figures``).
FIGURES = "figures"
#: The memory a variant's forward keeps for its backward (the runner's saved-bytes record).
SAVED_BYTES = "saved_bytes"
INTERPRETER_MEMORY = "not gated: run by the Triton interpreter, whose memory use is not the compiled kernel's"
#: The note of a model-accuracy row whose arms each trained one model (one seed): its interval covers the
#: evaluation tokens alone (the reports' caveats warn wherever such a row calls a difference).
ONE_TRAINING_RUN = "one training run per arm: the CI covers evaluation noise, not training noise"

_LOWER_HINTS = (
    "loss",
    "ppl",
    "perplex",
    "err",
    "nan",
    "inf",
    "spike",
    "gap",
    "cv",
    "latency",
    "time",
    "bytes",
    "divergen",
)
_HIGHER_HINTS = (
    "acc",
    "flops",
    "gbps",
    "gb_s",
    "tok",
    "throughput",
    "speedup",
    "per_s",
    "score",
    "f1",
    "bleu",
    "exact_match",
)


def higher_is_better(metric: str) -> bool:
    """Guess the direction of improvement from a metric name (loss/err/... lower; acc/tflops/... higher).

    Records can state it explicitly with ``details.higher_is_better``, which wins over this guess.
    """
    m = metric.lower()
    if any(h in m for h in _LOWER_HINTS):
        return False
    return any(h in m for h in _HIGHER_HINTS)


def metric_kind(dimension: str, metric: str, has_passed: bool = False) -> str:
    """latency | numerics | model_accuracy | memory | distribution | rate | info (see the module table)."""
    m, d = metric.lower(), dimension.lower()
    if d == FIGURES:  # a plugin's own figures (Ablation.figures): shown, one value per case, untested
        return "info"
    if m.startswith("latency") or (d == "throughput" and m.endswith(("_ms", "_us", "_ns"))):
        return "latency"
    if d == "memory" or m.endswith("bytes"):
        return "memory"
    if d == "accuracy":
        return "numerics" if has_passed else "model_accuracy"
    if d in ("stability", "generalization"):
        return "distribution"
    if d == "throughput":
        return "rate"
    return "info"


def memory_verdict(ratio: float, band: float = MEMORY_BAND) -> str:
    """Peak memory is deterministic: "less"/"more" beyond ``band`` (relative), else "same". The one rule
    for a run's rows and for ``compare``'s rows whose runs all measured the same peak."""
    return "less" if ratio < 1 - band else "more" if ratio > 1 + band else "same"
