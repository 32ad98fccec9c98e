"""The Same/Different probe: is "same arrangement" linearly decodable from a pair of embeddings?

The binding paper's control for plain structural discrimination. Each pair (e1, e2) becomes the
symmetric feature vector ``concat(|e1 - e2|, e1 * e2)`` (2d values); a logistic regression on
standardised features (scikit-learn ``StandardScaler`` + ``LogisticRegression``, L2, fitted inside
each training fold) predicts same (1) or different (0). Accuracy is measured with stratified
k-fold cross-validation, shuffled with a fixed seed, and reported as the mean and standard
deviation (ddof = 1) over folds.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler


def pair_features(pairs: np.ndarray) -> np.ndarray:
    """(n_pairs, 2, d) -> (n_pairs, 2d): ``concat(|e1 - e2|, e1 * e2)``, symmetric in e1, e2."""
    pairs = np.asarray(pairs, dtype=np.float64)
    if pairs.ndim != 3 or pairs.shape[1] != 2:
        raise ValueError(f"pair embeddings must be (n_pairs, 2, d), got {pairs.shape}")
    first, second = pairs[:, 0], pairs[:, 1]
    return np.concatenate([np.abs(first - second), first * second], axis=1)


def _check_labels(labels: np.ndarray, n_pairs: int, folds: int) -> np.ndarray:
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
    return labels


def same_different_probe(
    pairs: np.ndarray,
    labels: np.ndarray,
    *,
    folds: int = 5,
    C: float = 1.0,
    max_iter: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Cross-validated accuracy of a linear Same/Different probe on pair embeddings.

    ``pairs`` (n_pairs, 2, d), ``labels`` (n_pairs,) in {0, 1}. Returns ``accuracy_mean``,
    ``accuracy_std`` (over folds, ddof = 1), ``folds``, ``fold_accuracy`` (list), ``C``, ``n``.
    """
    features = pair_features(pairs)
    if not np.all(np.isfinite(features)):
        raise ValueError("pair embeddings hold NaN or infinite values")
    labels = _check_labels(labels, features.shape[0], folds)
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        # Perfectly separable folds can stop lbfgs at max_iter; the accuracy is still valid.
        warnings.simplefilter("ignore", ConvergenceWarning)
        scores = cross_val_score(probe, features, labels, cv=splitter, scoring="accuracy")
    return {
        "accuracy_mean": float(scores.mean()),
        "accuracy_std": float(scores.std(ddof=1)),
        "folds": int(folds),
        "fold_accuracy": [float(s) for s in scores],
        "C": float(C),
        "n": int(features.shape[0]),
    }
