"""Bootstrap intervals of the alignment metrics over held-out rows (real-embedding pairs).

Every metric with an interval is a function of sums over held-out rows, so a resample is a row
of counts ``w`` (:func:`repdiag.common.intervals.bootstrap_counts`: how often each row is drawn)
and the metric's value on it replaces each sum ``sum_r s_r`` by ``w . s``:

- pooled agreements (every intervention metric): ``A(w) = 1 - w . e / w . t`` with ``e_r``,
  ``t_r`` the error and total of all interventions on row ``r``
  (:func:`repdiag.alignment.interventions.intervention_metrics`, ``row_parts``);
- ``R^2`` (explained variance, translation R^2, cycle R^2):
  ``1 - w . ||x_r - p_r||^2 / (w . ||x_r||^2 - ||w . x||^2 / n)``, averaged over domains or
  directions as in the summary;
- row means (translation cosine, Jaccard, L0): ``w . v / n``;
- code correlation: each latent's Pearson correlation from the weighted sums of ``c_a``,
  ``c_b``, ``c_a^2``, ``c_b^2`` and ``c_a c_b`` (0 where a code is constant), weighted by firing
  frequency ``w . 1[c != 0] / n`` as in :func:`repdiag.alignment.metrics.code_correlation`.

Metrics that are not sums over rows (MCC and concept match, which rest on a matching; dead
latents, a minimum; probe transfer, which refits a probe; the sliced-Wasserstein distances,
which draw random directions; the attribute probes' accuracy, a property of the data) have no
interval here: their spread over seeds is reported instead. Percentile intervals,
:func:`repdiag.common.intervals.percentile_interval`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from repdiag.common.intervals import percentile_interval

INTERVAL_METRICS = (
    "tr_intervention",
    "cont_intervention",
    "tr_intervention_probe",
    "tr_intervention_input",
    "tr_latent_ablation",
    "explained_variance",
    "l0",
    "tr_r2",
    "tr_cosine",
    "jaccard",
    "code_correlation",
    "code_correlation_unweighted",
    "cycle_r2",
)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan
        )


def agreement_draws(counts: np.ndarray, error: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``1 - w . e / w . t`` per resample ``w`` (NaN where ``w . t = 0``)."""
    return 1.0 - _ratio(counts @ np.asarray(error, float), counts @ np.asarray(total, float))


def r2_draws(counts: np.ndarray, target: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """``R^2`` of :func:`repdiag.alignment.metrics.r2_score` per resample (module docstring)."""
    target = np.asarray(target, dtype=np.float64)
    residual = np.sum((target - np.asarray(prediction, dtype=np.float64)) ** 2, axis=1)
    centred = target - target.mean(0)  # a shift of every row changes no variance
    n = counts.sum(axis=1)
    spread = counts @ np.sum(centred**2, axis=1) - np.sum((counts @ centred) ** 2, axis=1) / n
    return 1.0 - _ratio(counts @ residual, spread)


def mean_draws(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``w . v / n``: the row mean of ``v`` per resample."""
    return counts @ np.asarray(values, dtype=np.float64) / counts.sum(axis=1)


def correlation_draws(
    counts: np.ndarray, codes_a: np.ndarray, codes_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Frequency-weighted and unweighted mean latent correlation of two codes per resample."""
    a, b = np.asarray(codes_a, np.float64), np.asarray(codes_b, np.float64)
    n = counts.sum(axis=1, keepdims=True)
    frequency = (counts @ (a != 0) + counts @ (b != 0)) / (2 * n)
    a, b = a - a.mean(0), b - b.mean(0)
    mean_a, mean_b = counts @ a / n, counts @ b / n
    cov = counts @ (a * b) / n - mean_a * mean_b
    var_a = counts @ (a * a) / n - mean_a**2
    var_b = counts @ (b * b) / n - mean_b**2
    scale = np.sqrt(np.clip(var_a, 0, None) * np.clip(var_b, 0, None))
    corr = np.nan_to_num(_ratio(cov, scale))
    used = frequency > 0
    weighted = _ratio(np.sum(frequency * corr, axis=1), np.sum(frequency, axis=1))
    unweighted = _ratio(np.sum(np.where(used, corr, 0), axis=1), used.sum(axis=1).astype(float))
    return np.where(used.any(axis=1), weighted, 0.0), np.where(used.any(axis=1), unweighted, 0.0)


def _row_cosine(prediction: np.ndarray, target: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    p, t = np.asarray(prediction, np.float64), np.asarray(target, np.float64)
    norms = np.linalg.norm(p, axis=1) * np.linalg.norm(t, axis=1)
    return np.where(norms > eps, np.sum(p * t, axis=1) / np.maximum(norms, eps), 0.0)


def _row_jaccard(codes_a: np.ndarray, codes_b: np.ndarray) -> np.ndarray:
    active_a, active_b = codes_a != 0, codes_b != 0
    union = np.sum(active_a | active_b, axis=1)
    return np.where(union > 0, np.sum(active_a & active_b, axis=1) / np.maximum(union, 1), 1.0)


def metric_draws(
    counts: np.ndarray,
    x: Sequence[np.ndarray],
    codes: Sequence[np.ndarray],
    reconstruction: Sequence[np.ndarray],
    translated: Mapping[tuple[int, int], np.ndarray],
    cycled: Mapping[tuple[int, int], np.ndarray],
    row_parts: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
    """``{metric: (n_boot,) draws}`` of every metric of :data:`INTERVAL_METRICS` the arrays
    define (the held-out rows of :func:`repdiag.alignment.metrics.evaluate_alignment`)."""
    directions = list(translated)
    draws = {
        name: agreement_draws(counts, error, total)
        for name, (error, total) in (row_parts or {}).items()
        if name in INTERVAL_METRICS
    }
    draws["explained_variance"] = np.mean(
        [r2_draws(counts, x[i], reconstruction[i]) for i in range(2)], axis=0
    )
    draws["l0"] = np.mean([mean_draws(counts, np.count_nonzero(c, axis=1)) for c in codes], axis=0)
    draws["tr_r2"] = np.mean([r2_draws(counts, x[j], translated[(i, j)]) for i, j in directions], 0)
    draws["tr_cosine"] = np.mean(
        [mean_draws(counts, _row_cosine(translated[(i, j)], x[j])) for i, j in directions], 0
    )
    draws["cycle_r2"] = np.mean([r2_draws(counts, x[i], cycled[(i, j)]) for i, j in directions], 0)
    draws["jaccard"] = mean_draws(counts, _row_jaccard(codes[0], codes[1]))
    weighted, unweighted = correlation_draws(counts, codes[0], codes[1])
    draws["code_correlation"], draws["code_correlation_unweighted"] = weighted, unweighted
    return draws


def intervals(draws: Mapping[str, np.ndarray], confidence: float) -> dict[str, list[float | None]]:
    """``{metric: [low, high]}`` for every metric of :data:`INTERVAL_METRICS`: the percentile
    interval of its draws, rounded for a JSON record; ``[None, None]`` without a finite draw
    (e.g. the intervention metrics when no attribute is scored)."""
    out: dict[str, list[float | None]] = {}
    for name in INTERVAL_METRICS:
        low, high = percentile_interval(draws.get(name, np.array([])), confidence)
        out[name] = [None if np.isnan(v) else round(v, 6) for v in (low, high)]
    return out


def mean_intervals(
    draws: Sequence[Mapping[str, np.ndarray]], confidence: float
) -> dict[str, list[float | None]]:
    """The interval of the mean over seeds: draw ``b`` of the mean is the mean of the seeds'
    draws ``b`` (each seed resampled its own held-out rows independently). Only metrics every
    seed has."""
    names = [m for m in INTERVAL_METRICS if all(m in d for d in draws)] if draws else []
    return intervals({m: np.mean([d[m] for d in draws], axis=0) for m in names}, confidence)
