"""Statistics: estimators, tests, multiple-comparison control and verdicts (DESIGN.md "Statistics").

One module per job:

``latency``        interleaved-round latency: paired ratio + bootstrap CI, rank test, A/A band, verdict
``accuracy``       model-level accuracy: paired per-token bootstrap, seed means (Welch), non-inferiority
``numerics``       kernel output vs float64 truth, calibrated by the baseline's own error; degenerate guards
``distributions``  stability / generalization summaries over seeds: Mann-Whitney + bootstrap CI
``multiple``       Holm (gating family) and Benjamini-Hochberg (exploratory)
``quality``        machine noise from IQR/median: ok / noisy / unreliable
``outliers``       Tukey-fence classification (kept, reported)
``bootstrap``      seeded, chunked resampling shared by all of the above
``table``          the tidy comparison table from run records, and saving it
``render``         rich console rendering of that table

Every bootstrap is seeded: the same records and seed give the same numbers.
"""

from .accuracy import (
    ACCURACY_VERDICTS,
    AccuracyComparison,
    accuracy_verdict,
    compare_paired_accuracy,
    compare_seed_accuracy,
    compare_unpaired_accuracy,
    estimate_seeds_needed,
)
from .bootstrap import DEFAULT_N_BOOT, make_rng, percentile_ci
from .distributions import (
    DistributionComparison,
    compare_distributions,
    count_loss_spikes,
    count_nonfinite,
    grad_norm_cv,
)
from .latency import (
    LATENCY_VERDICTS,
    LatencyComparison,
    aa_halves,
    compare_latency,
    decide_latency,
    estimate_rounds_needed,
)
from .multiple import adjust_pvalues, benjamini_hochberg, holm
from .numerics import (
    NumericsErrors,
    NumericsVerdict,
    judge_outputs,
    numerics_errors,
    numerics_verdict,
    unit_roundoff,
)
from .outliers import OutlierCounts, classify_outliers
from .quality import NOISY, UNRELIABLE, NoiseQuality, classify_noise
from .render import VERDICT_STYLES, print_table, render_table
from .table import TABLE_COLUMNS, compare_records, higher_is_better, metric_kind, save_table

__all__ = [
    "ACCURACY_VERDICTS",
    "DEFAULT_N_BOOT",
    "LATENCY_VERDICTS",
    "NOISY",
    "TABLE_COLUMNS",
    "UNRELIABLE",
    "VERDICT_STYLES",
    "AccuracyComparison",
    "DistributionComparison",
    "LatencyComparison",
    "NoiseQuality",
    "NumericsErrors",
    "NumericsVerdict",
    "OutlierCounts",
    "aa_halves",
    "accuracy_verdict",
    "adjust_pvalues",
    "benjamini_hochberg",
    "classify_noise",
    "classify_outliers",
    "compare_distributions",
    "compare_latency",
    "compare_paired_accuracy",
    "compare_records",
    "compare_seed_accuracy",
    "compare_unpaired_accuracy",
    "count_loss_spikes",
    "count_nonfinite",
    "decide_latency",
    "estimate_rounds_needed",
    "estimate_seeds_needed",
    "grad_norm_cv",
    "higher_is_better",
    "holm",
    "judge_outputs",
    "make_rng",
    "metric_kind",
    "numerics_errors",
    "numerics_verdict",
    "percentile_ci",
    "print_table",
    "render_table",
    "save_table",
    "unit_roundoff",
]
