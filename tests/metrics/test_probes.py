"""Same/Different probe: separable pairs, shuffled labels, features, folds, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler

from repdiag.metrics.probes import pair_features, same_different_probe


def _pairs(n: int = 200, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Same pairs are near-copies, different pairs are independent draws."""
    rng = np.random.default_rng(seed)
    labels = np.tile([0, 1], n // 2)
    first = rng.normal(size=(n, d))
    second = np.where(
        labels[:, None] == 1, first + 0.05 * rng.normal(size=(n, d)), rng.normal(size=(n, d))
    )
    return np.stack([first, second], axis=1), labels


def test_pair_features_formula_and_symmetry() -> None:
    pairs = np.array([[[1.0, -2.0], [3.0, 0.5]]])
    np.testing.assert_allclose(pair_features(pairs), [[2.0, 2.5, 3.0, -1.0]])
    swapped = pairs[:, ::-1]
    np.testing.assert_allclose(pair_features(swapped), pair_features(pairs))


def test_separable_pairs_reach_near_perfect_accuracy() -> None:
    pairs, labels = _pairs()
    result = same_different_probe(pairs, labels, folds=5, seed=0)
    assert result["accuracy_mean"] >= 0.97
    assert result["folds"] == 5 and len(result["fold_accuracy"]) == 5
    assert result["n"] == 200


def test_shuffled_labels_stay_near_half() -> None:
    pairs, labels = _pairs()
    shuffled = np.random.default_rng(1).permutation(labels)
    result = same_different_probe(pairs, shuffled, folds=5, seed=0)
    assert abs(result["accuracy_mean"] - 0.5) < 0.12


def test_matches_a_manual_cross_validation() -> None:
    pairs, labels = _pairs(n=80, seed=2)
    labels = np.random.default_rng(3).permutation(labels)  # not trivially separable
    result = same_different_probe(pairs, labels, folds=4, C=0.5, seed=7)
    features = np.concatenate([np.abs(pairs[:, 0] - pairs[:, 1]), pairs[:, 0] * pairs[:, 1]], 1)
    accuracies = []
    splits = StratifiedKFold(4, shuffle=True, random_state=7).split(features, labels)
    for train, test in splits:
        scaler = StandardScaler().fit(features[train])  # fitted on the training fold only
        model = LogisticRegression(C=0.5, max_iter=1000).fit(
            scaler.transform(features[train]), labels[train]
        )
        accuracies.append(np.mean(model.predict(scaler.transform(features[test])) == labels[test]))
    assert result["fold_accuracy"] == pytest.approx(accuracies)
    assert result["accuracy_mean"] == pytest.approx(np.mean(accuracies))
    assert result["accuracy_std"] == pytest.approx(np.std(accuracies, ddof=1))


def test_fixed_seed_is_deterministic_and_seed_changes_folds() -> None:
    pairs, labels = _pairs(n=60, seed=4)
    labels = np.random.default_rng(5).permutation(labels)
    first = same_different_probe(pairs, labels, folds=3, seed=11)
    assert same_different_probe(pairs, labels, folds=3, seed=11) == first
    others = [same_different_probe(pairs, labels, folds=3, seed=s)["fold_accuracy"] for s in (1, 2)]
    assert any(o != first["fold_accuracy"] for o in others)


@pytest.mark.parametrize(
    ("pairs", "labels", "folds", "message"),
    [
        (np.ones((10, 3, 2)), np.tile([0, 1], 5), 2, r"\(n_pairs, 2, d\)"),
        (np.ones((10, 2, 2)), np.tile([0, 1], 4), 2, "labels must be"),
        (np.ones((10, 2, 2)), np.tile([0, 2], 5), 2, "0 \\(different\\) or 1"),
        (np.ones((10, 2, 2)), np.array([1] * 8 + [0] * 2), 3, "smaller class has 2"),
        (np.full((10, 2, 2), np.nan), np.tile([0, 1], 5), 2, "NaN"),
    ],
)
def test_bad_input_is_rejected(pairs, labels, folds: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        same_different_probe(pairs, labels, folds=folds)
