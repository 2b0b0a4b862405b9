"""Seeded, deterministic bootstrap resampling shared by every estimator in ``microscope.stats``.

Why the bootstrap: the quantities we report (a ratio of medians, a difference of means over tokens
clustered in sequences, a median over seeds) have no convenient closed-form sampling distribution, and
the samples are small (a few dozen rounds, a handful of seeds). The percentile bootstrap needs no
distributional assumption and handles any statistic the same way.

Why seeded: a report must be reproducible. The same records and the same seed give the same CI to the
last digit, so a reviewer re-running ``microscope report`` sees the numbers the author saw. Each
comparison derives its own stream from the seed plus stable text keys (``zlib.crc32``, never the
salted built-in ``hash``), so adding a row to a table does not shift the intervals of the others.

Memory stays bounded: resampling indices are drawn in chunks of at most ``MAX_CELLS`` elements, so a
paired bootstrap over 100k per-token losses does not allocate ``n_boot x 100k`` integers at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

__all__ = [
    "DEFAULT_N_BOOT",
    "MAX_CELLS",
    "bootstrap",
    "bootstrap_clustered_mean",
    "bootstrap_p",
    "make_rng",
    "percentile_ci",
]

#: Replicates drawn by default: the 2.5% / 97.5% percentiles then rest on ~250 replicates each.
DEFAULT_N_BOOT = 10_000
#: Upper bound on the elements of one chunk of resampling indices (~32 MB of int64).
MAX_CELLS = 4_000_000


def make_rng(seed: int | np.random.Generator = 0, *keys: object) -> np.random.Generator:
    """A generator seeded by ``seed`` and by stable hashes of ``keys`` (e.g. plugin, case, metric).

    Passing a ``Generator`` returns it unchanged, so callers can share one stream when they want to.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    entropy = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(str(k).encode("utf-8")) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def percentile_ci(replicates: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided ``1 - alpha`` percentile interval of bootstrap replicates (NaN-free input)."""
    reps = np.asarray(replicates, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def bootstrap_p(replicates: np.ndarray, null: float = 0.0) -> float:
    """Two-sided p of ``null`` from bootstrap replicates: twice the smaller tail fraction at ``null``.

    It is the p that matches ``percentile_ci``: the interval at level alpha excludes ``null`` exactly
    when this p is below alpha, so a verdict that reads either one reads the same thing.
    """
    reps = np.asarray(replicates, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return float("nan")
    tail = min(float(np.mean(reps <= null)), float(np.mean(reps >= null)))
    return min(1.0, 2.0 * tail)


def _index_chunks(n: int, n_boot: int, rng: np.random.Generator, rows: int) -> Iterator[np.ndarray]:
    done = 0
    while done < n_boot:
        take = min(rows, n_boot - done)
        yield rng.integers(0, n, size=(take, n))
        done += take


def bootstrap(
    samples: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    paired: bool,
    n_boot: int = DEFAULT_N_BOOT,
    rng: np.random.Generator,
) -> np.ndarray:
    """Bootstrap replicates of ``statistic(*resampled)``.

    ``statistic`` receives one 2-D array per sample (rows = replicates) and must return one value per
    row (e.g. ``lambda b, c: np.median(c, 1) / np.median(b, 1)``).

    ``paired=True`` draws one set of indices shared by all samples (they must have equal length): the
    i-th elements of the samples stay together, which keeps whatever they share (the same round of an
    interleaved run, the same token of an eval set) and so cancels it from the statistic's variance.
    ``paired=False`` resamples each sample independently.
    """
    arrays = [np.asarray(s, dtype=float) for s in samples]
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    if any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("bootstrap samples must be non-empty 1-D arrays")
    if paired and len({a.size for a in arrays}) != 1:
        raise ValueError("a paired bootstrap needs samples of equal length")
    widest = max(a.size for a in arrays)
    rows = max(1, MAX_CELLS // widest)
    out: list[np.ndarray] = []
    if paired:
        for idx in _index_chunks(arrays[0].size, n_boot, rng, rows):
            out.append(np.asarray(statistic(*(a[idx] for a in arrays)), dtype=float))
    else:
        iters = [_index_chunks(a.size, n_boot, rng, rows) for a in arrays]
        for idxs in zip(*iters):
            out.append(np.asarray(statistic(*(a[i] for a, i in zip(arrays, idxs))), dtype=float))
    return np.concatenate(out)


def bootstrap_clustered_mean(
    values: np.ndarray,
    groups: np.ndarray,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """Cluster bootstrap of a mean: resample whole groups (e.g. eval sequences), not single elements.

    Per-token losses of one sequence are correlated (a hard passage makes every token hard), so an
    i.i.d. bootstrap over tokens understates the variance. Resampling sequences keeps that correlation
    inside each replicate. Returns the replicates of ``sum(values) / count`` and the number of groups.
    """
    values = np.asarray(values, dtype=float)
    groups = np.asarray(groups)
    if values.shape != groups.shape or values.ndim != 1:
        raise ValueError("values and groups must be 1-D arrays of the same length")
    _, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=values)
    counts = np.bincount(inverse).astype(float)
    k = sums.size
    rows = max(1, MAX_CELLS // k)
    out = [sums[idx].sum(axis=1) / counts[idx].sum(axis=1) for idx in _index_chunks(k, n_boot, rng, rows)]
    return np.concatenate(out), k
