"""The pre-registered primary family of the family comparison (docs/binding.md, the second
design): one correlation with the binding score per listed metric, over the units (final
networks, seeds averaged), each with its bootstrap interval over units, Pearson's t p and a
permutation p over units, and both p Holm-adjusted over the family (Holm 1979).

The permutation p (:func:`repdiag.common.exact.permutation_correlation_p`: every order of the
units up to 8 of them, else 9999 seeded orders) does not rest on normality; the verdict is read
from its Holm-adjusted value, with the t p's beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from repdiag.binding.analysis.options import StatsSettings
from repdiag.binding.analysis.units import UNIT, comparison_units, require_units, runs_behind
from repdiag.common import statistics as stats
from repdiag.common.claims import study_claims
from repdiag.common.exact import holm, permutation_correlation_p
from repdiag.common.power import correlation_power, detectable_correlation

PRIMARY_COLUMNS = [
    "metric", "target", "binding_score", "unit", "n", "n_runs", "pearson_r", "pearson_ci_low",
    "pearson_ci_high", "pearson_p", "permutation_p", "holm_p", "holm_permutation_p",
    "family_size", "reject_at", "rejected", "power_at_paper_r", "power_at_paper_r_holm_first",
    "r_detectable_80", "note",
]  # fmt: skip


def primary_table(
    means: pd.DataFrame, settings: StatsSettings, metrics: Sequence[str]
) -> pd.DataFrame:
    """One row per metric of the pre-registered family: r(metric, binding) over ``means`` (one
    row per unit, refused otherwise), its interval, t p, permutation p and their Holm-adjusted
    values over the family's metrics; ``rejected`` where the Holm-adjusted permutation p is at
    most 1 - confidence. A metric the table lacks is a row of NaN with a note."""
    require_units(means, "the primary family")
    present = [m for m in metrics if m in means.columns]
    units = comparison_units(means)
    options = settings.options()
    correlations = stats.correlation_table(means, "binding", present, units=units, **options)
    by_metric = correlations.set_index("metric") if len(correlations) else None
    rows = []
    for metric in metrics:
        row = {"metric": metric, "note": f"{metric} is not a column of the models table"}
        if by_metric is not None and metric in by_metric.index:
            found = by_metric.loc[metric]
            x, y = means[metric].to_numpy(float), means["binding"].to_numpy(float)
            row = {
                "metric": metric,
                "n": int(found["n"]),
                "n_runs": runs_behind(means, [metric, "binding"]),
                **{key: float(found[key]) for key in ("pearson_r", "pearson_ci_low",
                                                       "pearson_ci_high", "pearson_p")},
                "permutation_p": permutation_correlation_p(x, y, seed=settings.draw_seed),
                "note": str(found.get("note") or ""),
            }  # fmt: skip
        rows.append(row)
    frame = pd.DataFrame(rows).reindex(columns=PRIMARY_COLUMNS)
    frame["target"] = "binding"
    frame["binding_score"] = settings.binding_score
    frame["unit"] = UNIT
    frame["family_size"] = len(metrics)
    frame["reject_at"] = round(1 - settings.confidence, 12)
    frame["holm_p"] = _holm_over_family(frame["pearson_p"])
    frame["holm_permutation_p"] = _holm_over_family(frame["permutation_p"])
    adjusted = frame["holm_permutation_p"].to_numpy(float)
    frame["rejected"] = np.isfinite(adjusted) & (adjusted <= frame["reject_at"].to_numpy(float))
    _power_columns(frame, 1 - settings.confidence, len(metrics))
    frame["note"] = frame["note"].fillna("")
    return frame


def _power_columns(frame: pd.DataFrame, alpha: float, family_size: int) -> None:
    """What each test's n could detect (repdiag.common.power, Fisher z): its power at the paper's
    r(JER, binding) at level ``alpha`` and at Holm's first step (``alpha / family_size``), and
    the smallest |r| it detects with 80% power at ``alpha``."""
    paper_r = study_claims("binding")["jer_binding_r"].value
    n = [int(v) if np.isfinite(v) else 0 for v in frame["n"].astype(float)]
    frame["power_at_paper_r"] = [correlation_power(paper_r, k, alpha) for k in n]
    frame["power_at_paper_r_holm_first"] = [
        correlation_power(paper_r, k, alpha / family_size) for k in n
    ]
    frame["r_detectable_80"] = [detectable_correlation(k, 0.8, alpha) for k in n]


def _holm_over_family(p_values: pd.Series) -> np.ndarray:
    """Holm over every pre-registered test: one that could not be computed counts as p = 1 (it
    rejects nothing and keeps the family's size), and its adjusted p stays NaN."""
    p = p_values.to_numpy(float)
    adjusted = holm(np.where(np.isfinite(p), p, 1.0))
    return np.where(np.isfinite(p), adjusted, np.nan)


def family_design_tables(
    models: pd.DataFrame, settings: StatsSettings, primary: Sequence[str]
) -> dict[str, pd.DataFrame]:
    """The second design's own tables beside the main study's: ``primary`` (the pre-registered
    family over the units' final networks) and ``within_run`` (the secondary within-run split
    over every headline metric, :mod:`repdiag.binding.analysis.within_run`)."""
    from repdiag.binding.analysis.statistics import family_means, headline_metrics
    from repdiag.binding.analysis.within_run import within_run_table

    metrics = headline_metrics(models, settings)
    return {
        "primary": primary_table(family_means(models), settings, primary),
        "within_run": within_run_table(models, metrics, settings.confidence, settings.draw_seed),
    }
