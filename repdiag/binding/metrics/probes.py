"""The Same/Different probe: is "same arrangement" linearly decodable from a pair of embeddings?

The binding paper's control for plain structural discrimination. Each pair (e1, e2) becomes the
symmetric feature vector ``concat(|e1 - e2|, e1 * e2)`` (2d values); an L2 logistic regression on
standardised features (scikit-learn ``StandardScaler`` + ``LogisticRegression``, lbfgs) predicts
same (1) or different (0).

Nested cross-validation. The outer loop is stratified k-fold (``folds``, shuffled with ``seed``);
every pair is predicted exactly once, by a probe that never saw it. Inside each outer training
fold an inner stratified k-fold (``inner_folds``) scores every C of the grid ``Cs`` by inner
held-out accuracy; the best C (ties: the smallest, i.e. the strongest regularisation) is refitted
on the whole outer training fold and predicts the outer test fold. The scaler is fitted on the
training part of every fit, inner or outer, so no test row influences the scaling, the chosen C
or the weights.

Reported accuracy is the pooled out-of-fold accuracy, ``hits / n`` over all pairs, with its
Wilson 95% interval (:func:`repdiag.binding.metrics.readouts.wilson_interval`), the two-sided exact
binomial test against 0.5 (``scipy.stats.binomtest``) and ``above_chance = ci_low > 0.5``. The
accuracy of each outer fold and the C it chose are kept.

Speed: 5 outer x 3 inner folds x 5 Cs = 80 lbfgs fits per probe, about 2 s at 2048 pairs x
1024 features on one CPU core. Three choices make it so. (1) Each inner fold walks the grid from
the smallest C up with ``warm_start``, so every fit starts at the previous, more regularised
optimum. (2) lbfgs stops at ``TOL = 1e-5`` on the projected gradient of scikit-learn's
sample-averaged loss (the default 1e-4 lets warm-started large-C fits stop at once, silently
flattening the grid; 1e-5 and 1e-7 give the same accuracy to 0.1 %). (3) The fits run with BLAS
limited to one thread (``threadpoolctl``): on matrices this small OpenBLAS threads only contend
(2 threads on 2 busy cores took 10-50 s for the same probe). A closed-form ridge classifier with
leave-one-out would avoid the iterations, but it is a weaker probe than the logistic one of the
paper (several points lower accuracy on the same data) and is not the k-fold search configured.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import binomtest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from repdiag.binding.metrics.options import ProbeSettings
from repdiag.common.intervals import wilson_interval

TOL = 1e-5
# The probe's entry in results/metrics/<model>.json (the C grid itself is in config.metrics).
PROBE_FIELDS = (
    "accuracy",
    "ci_low",
    "ci_high",
    "ci_method",
    "n",
    "hits",
    "p_value",
    "above_chance",
    "folds",
    "inner_folds",
    "fold_accuracy",
    "fold_C",
)


def pair_features(pairs: np.ndarray) -> np.ndarray:
    """(n_pairs, 2, d) -> (n_pairs, 2d): ``concat(|e1 - e2|, e1 * e2)``, symmetric in e1, e2."""
    pairs = np.asarray(pairs, dtype=np.float64)
    if pairs.ndim != 3 or pairs.shape[1] != 2:
        raise ValueError(f"pair embeddings must be (n_pairs, 2, d), got {pairs.shape}")
    first, second = pairs[:, 0], pairs[:, 1]
    return np.concatenate([np.abs(first - second), first * second], axis=1)


def _check_labels(labels: np.ndarray, n_pairs: int, folds: int, inner_folds: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n_pairs,):
        raise ValueError(f"labels must be ({n_pairs},) to match the pairs, got {labels.shape}")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0 (different) or 1 (same)")
    labels = labels.astype(np.int64)
    smallest = int(np.bincount(labels, minlength=2).min())
    if folds < 2 or smallest < folds:
        raise ValueError(
            f"stratified {folds}-fold cross-validation needs folds >= 2 and at least {folds} "
            f"pairs of each label; the smaller class has {smallest}"
        )
    inner_smallest = smallest - -(-smallest // folds)  # fewest per class in a training fold
    if inner_folds < 2 or inner_smallest < inner_folds:
        raise ValueError(
            f"the inner {inner_folds}-fold search needs inner_folds >= 2 and at least "
            f"{inner_folds} pairs of each label in every outer training fold; the smaller class "
            f"has {inner_smallest} there"
        )
    return labels


def _check_grid(Cs: Sequence[float]) -> list[float]:
    grid = sorted({float(c) for c in Cs})
    if not grid or not all(np.isfinite(c) and c > 0 for c in grid):
        raise ValueError(f"the C grid must hold positive finite values, got {list(Cs)}")
    return grid


def _fit(x: np.ndarray, y: np.ndarray, C: float, max_iter: int) -> tuple[StandardScaler, Any]:
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=C, max_iter=max_iter, tol=TOL)
    return scaler, model.fit(scaler.transform(x), y)


def select_C(
    x: np.ndarray,
    y: np.ndarray,
    Cs: Sequence[float],
    *,
    inner_folds: int,
    max_iter: int,
    seed: int,
) -> tuple[float, np.ndarray]:
    """The C of ``Cs`` with the best inner k-fold accuracy on (x, y) (ties: the smallest C).

    Returns (C, inner accuracy per C in ascending C order). Only rows of (x, y) are used.
    """
    grid = _check_grid(Cs)
    hits = np.zeros(len(grid))
    splitter = StratifiedKFold(n_splits=inner_folds, shuffle=True, random_state=seed)
    for train, test in splitter.split(x, y):
        scaler = StandardScaler().fit(x[train])
        x_train, x_test = scaler.transform(x[train]), scaler.transform(x[test])
        model = LogisticRegression(max_iter=max_iter, tol=TOL, warm_start=True)
        for j, C in enumerate(grid):  # ascending C: each fit starts at the previous optimum
            model.set_params(C=C).fit(x_train, y[train])
            hits[j] += np.count_nonzero(model.predict(x_test) == y[test])
    accuracy = hits / len(y)
    best = int(np.flatnonzero(accuracy == accuracy.max())[0])
    return grid[best], accuracy


def same_different_probe(
    pairs: np.ndarray, labels: np.ndarray, settings: ProbeSettings, seed: int
) -> dict[str, Any]:
    """Nested cross-validated accuracy of a linear Same/Different probe on pair embeddings.

    ``pairs`` (n_pairs, 2, d), ``labels`` (n_pairs,) in {0, 1}. Returns ``accuracy`` (pooled
    out-of-fold, ``hits / n``), ``ci_low``, ``ci_high`` (Wilson 95%), ``ci_method``, ``n``,
    ``hits``, ``p_value`` (two-sided exact binomial test of accuracy = 0.5), ``above_chance``
    (``ci_low > 0.5``), ``folds``, ``inner_folds``, ``Cs`` (the grid, ascending),
    ``fold_accuracy`` and ``fold_C`` (per outer fold, in fold order).
    """
    features = pair_features(pairs)
    if not np.all(np.isfinite(features)):
        raise ValueError("pair embeddings hold NaN or infinite values")
    folds, inner_folds, max_iter = settings.folds, settings.inner_folds, settings.max_iter
    labels = _check_labels(labels, features.shape[0], folds, inner_folds)
    grid = _check_grid(settings.Cs)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    correct = np.zeros(len(labels), dtype=bool)
    fold_accuracy, fold_C = [], []
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        # Perfectly separable folds can stop lbfgs at max_iter; the accuracy is still valid.
        warnings.simplefilter("ignore", ConvergenceWarning)
        for train, test in splitter.split(features, labels):
            C, _ = select_C(
                features[train],
                labels[train],
                grid,
                inner_folds=inner_folds,
                max_iter=max_iter,
                seed=seed,
            )
            scaler, model = _fit(features[train], labels[train], C, max_iter)
            correct[test] = model.predict(scaler.transform(features[test])) == labels[test]
            fold_accuracy.append(float(correct[test].mean()))
            fold_C.append(C)
    n, hits = len(labels), int(correct.sum())
    low, high = wilson_interval(hits, n)
    return {
        "accuracy": hits / n,
        "ci_low": low,
        "ci_high": high,
        "ci_method": "wilson",
        "n": n,
        "hits": hits,
        "p_value": float(binomtest(hits, n, 0.5, alternative="two-sided").pvalue),
        "above_chance": bool(low > 0.5),
        "folds": folds,
        "inner_folds": inner_folds,
        "Cs": grid,
        "fold_accuracy": fold_accuracy,
        "fold_C": fold_C,
    }
