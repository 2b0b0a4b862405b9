"""Number formatting shared by the Markdown and HTML reports, so both say the same thing the same way.

Values are formatted by what the metric measures (a byte count reads as MiB, an error as 1.2e-03, a
p-value as <1e-4), and missing or non-finite values always read as "-", never as "nan".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MISSING = "-"


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (None, NaN, inf, text that is not a number)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def is_time_metric(metric: str) -> bool:
    """Latency-like metrics, where a smaller value is better (``latency_ms``, ``step_time_s``)."""
    m = metric.lower()
    if is_rate_metric(metric) or m.endswith(("_share", "_fraction")):  # comm_time_share: a part of the time
        return False
    return "latency" in m or "time" in m or m.endswith(("_ms", "_us", "_s", "_ns"))


def is_rate_metric(metric: str) -> bool:
    """Throughput-like metrics, where a larger value is better (``tokens_per_s``, ``tflops``)."""
    m = metric.lower()
    return any(k in m for k in ("per_s", "/s", "tokens_s", "tflops", "gbps", "throughput", "per_sec"))


def num(value: Any, spec: str = ".4g") -> str:
    f = finite(value)
    return MISSING if f is None else format(f, spec)


def pvalue(value: Any) -> str:
    f = finite(value)
    if f is None:
        return MISSING
    return "<1e-4" if f < 1e-4 else format(f, ".2g")


def pct(value: Any, signed: bool = True) -> str:
    f = finite(value)
    if f is None:
        return MISSING
    return format(f, "+.1%" if signed else ".1%").replace("-", "\u2212")


def size(value: Any) -> str:
    """A byte count in the binary unit that keeps it readable (``812 B``, ``1.6 KiB``, ``300 MiB``)."""
    f = finite(value)
    if f is None:
        return MISSING
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(f) >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.0f} B"


def times(value: Any) -> str:
    """A multiplicative factor, ``×1.83``."""
    f = finite(value)
    return MISSING if f is None else f"\u00d7{f:.3g}"


def metric_value(metric: str, value: Any, unit: str = "") -> str:
    """A raw measurement, formatted by what it measures."""
    f = finite(value)
    if f is None:
        return MISSING
    m = metric.lower()
    if m.endswith("bytes") or unit == "bytes":
        return size(f)
    if m.endswith("err") or "rel_err" in m:
        return format(f, ".2e")
    if m == "latency_ms" or unit == "ms":
        return f"{f:.4g} ms"
    return format(f, ".4g") + (f" {unit}" if unit and unit not in ("ratio",) else "")


def ci(low: Any, high: Any) -> str:
    lo, hi = finite(low), finite(high)
    return MISSING if lo is None or hi is None else f"[{lo:.3g}, {hi:.3g}]"


def span(values: list[float], render: Callable[[float], str]) -> str:
    """``render(min) to render(max)``, or one value when they coincide."""
    vals = sorted(v for v in values if finite(v) is not None)
    if not vals:
        return ""
    lo, hi = render(vals[0]), render(vals[-1])
    return lo if lo == hi else f"{lo} to {hi}"


def clip(text: Any, limit: int) -> str:
    """Text cut to ``limit`` characters with an ellipsis (None reads as empty)."""
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: max(0, limit - 1)] + "\u2026"


def _case_axis(token: str) -> str:
    """The axis a case-id token belongs to: ``seq=100`` -> seq, ``no_causal``/``causal`` -> causal,
    ``bf16`` -> dtype."""
    if "=" in token:
        return token.split("=", 1)[0]
    if token in ("fp64", "fp32", "fp16", "bf16"):
        return "dtype"
    return token[3:] if token.startswith("no_") else token


def case_labels(case_ids: Any) -> dict[str, str]:
    """Each case id shortened to the axes that vary among ``case_ids`` (``seq=1024,bf16``), so rows can
    be told apart without the axes every case shares; a single case keeps its full id."""
    ids = [str(c) for c in dict.fromkeys(case_ids) if str(c)]
    if len(ids) <= 1:
        return {c: c for c in ids}
    parsed = {c: [(t, _case_axis(t)) for t in c.split(",")] for c in ids}
    values: dict[str, set[str]] = {}
    for tokens in parsed.values():
        for token, axis in tokens:
            values.setdefault(axis, set()).add(token)
    varying = {axis for axis, seen in values.items() if len(seen) > 1}
    shared = {axis for axis in values if all(any(a == axis for _, a in t) for t in parsed.values())}
    labels = {}
    for case, tokens in parsed.items():
        kept = [t for t, axis in tokens if axis in varying or axis not in shared]
        labels[case] = ",".join(kept) or case
    return labels
