"""Same/Different probe: nested C search, pooled accuracy, Wilson interval, test against 0.5."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom, binomtest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler

from repdiag.binding.metrics import probes
from repdiag.binding.metrics.probes import (
    PROBE_FIELDS,
    ProbeSettings,
    pair_features,
    same_different_probe,
    select_C,
)

GRID = ProbeSettings.from_config({}).Cs
"""The schema's C grid."""


def probe(pairs: np.ndarray, labels: np.ndarray, seed: int, **settings) -> dict:
    """The probe at the schema's settings with ``settings`` over them."""
    return same_different_probe(pairs, labels, ProbeSettings.from_config(settings), seed)


def _pairs(
    n: int = 200, d: int = 6, seed: int = 0, noise: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """Same pairs are near-copies, different pairs are independent draws."""
    rng = np.random.default_rng(seed)
    labels = np.tile([0, 1], n // 2)
    first = rng.normal(size=(n, d))
    second = np.where(
        labels[:, None] == 1, first + noise * rng.normal(size=(n, d)), rng.normal(size=(n, d))
    )
    return np.stack([first, second], axis=1), labels


def _wilson(hits: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_pair_features_formula_and_symmetry() -> None:
    pairs = np.array([[[1.0, -2.0], [3.0, 0.5]]])
    np.testing.assert_allclose(pair_features(pairs), [[2.0, 2.5, 3.0, -1.0]])
    swapped = pairs[:, ::-1]
    np.testing.assert_allclose(pair_features(swapped), pair_features(pairs))


def test_separable_pairs_reach_near_perfect_accuracy_with_a_tight_interval() -> None:
    pairs, labels = _pairs()
    result = probe(pairs, labels, 0, folds=5)
    assert set(result) == {*PROBE_FIELDS, "Cs"}
    assert result["accuracy"] >= 0.97 and result["ci_low"] > 0.9
    assert result["above_chance"] and result["p_value"] < 1e-30
    assert result["folds"] == 5 and len(result["fold_accuracy"]) == len(result["fold_C"]) == 5
    assert result["n"] == 200 and result["hits"] == round(result["accuracy"] * 200)
    assert set(result["fold_C"]) <= set(result["Cs"])


def test_label_independent_features_give_an_interval_around_half() -> None:
    rng = np.random.default_rng(1)
    pairs = rng.normal(size=(400, 2, 8))
    labels = rng.permutation(np.tile([0, 1], 200))
    result = probe(pairs, labels, 0, folds=5)
    assert result["ci_low"] < 0.5 < result["ci_high"]
    assert not result["above_chance"] and result["p_value"] > 0.05


def test_constant_features_score_exactly_half() -> None:
    """No information: every probe predicts one class; balanced test folds are half right."""
    pairs = np.ones((200, 2, 4))
    labels = np.tile([0, 1], 100)
    result = probe(pairs, labels, 0, folds=5)
    assert result["accuracy"] == 0.5 and result["hits"] == 100
    assert result["fold_accuracy"] == [0.5] * 5
    assert result["p_value"] == 1.0 and not result["above_chance"]
    assert result["fold_C"] == [min(GRID)] * 5  # every C ties: the smallest wins


def test_interval_and_p_value_follow_the_binomial_formulas() -> None:
    pairs, labels = _pairs(n=120, seed=2, noise=1.5)  # an imperfect probe
    result = probe(pairs, labels, 5, folds=4)
    hits, n = result["hits"], result["n"]
    assert 0 < hits < n and result["accuracy"] == hits / n
    assert (result["ci_low"], result["ci_high"]) == pytest.approx(_wilson(hits, n), abs=1e-12)
    scipy_ci = binomtest(hits, n).proportion_ci(method="wilson")
    assert result["ci_low"] == pytest.approx(scipy_ci.low)
    tail = min(hits, n - hits)  # two-sided exact test at p = 0.5: twice the smaller tail
    assert result["p_value"] == pytest.approx(min(1.0, 2 * binom.cdf(tail, n, 0.5)))
    assert result["above_chance"] == (result["ci_low"] > 0.5)


def test_pooled_accuracy_matches_a_manual_cross_validation_at_one_C() -> None:
    """A one-value grid leaves only the outer loop: compare it with a hand-written one."""
    pairs, labels = _pairs(n=80, seed=2)
    labels = np.random.default_rng(3).permutation(labels)  # not trivially separable
    result = probe(pairs, labels, 7, folds=4, Cs=[0.5])
    features = np.concatenate([np.abs(pairs[:, 0] - pairs[:, 1]), pairs[:, 0] * pairs[:, 1]], 1)
    accuracies, hits = [], 0
    splits = StratifiedKFold(4, shuffle=True, random_state=7).split(features, labels)
    for train, test in splits:
        scaler = StandardScaler().fit(features[train])  # fitted on the training fold only
        model = LogisticRegression(C=0.5, max_iter=1000, tol=probes.TOL)
        model.fit(scaler.transform(features[train]), labels[train])
        right = model.predict(scaler.transform(features[test])) == labels[test]
        accuracies.append(right.mean())
        hits += int(right.sum())
    assert result["fold_accuracy"] == pytest.approx(accuracies)
    assert result["hits"] == hits and result["accuracy"] == pytest.approx(hits / 80)
    assert result["fold_C"] == [0.5] * 4


def test_C_search_prefers_strong_penalty_when_easy_and_weak_when_features_must_be_unmixed() -> None:
    """Easy isotropic signal: every C is perfect, the smallest wins. Signal in the difference
    of two almost identical features: a heavy penalty reads the class-mean direction (x1 alone,
    swamped by the shared z) and only a light one finds x1 - x2."""
    rng = np.random.default_rng(0)
    n = 400
    y = np.tile([0, 1], n // 2)
    easy = rng.normal(size=(n, 10)) + 3.0 * (2 * y[:, None] - 1)
    C_easy, accuracy_easy = select_C(easy, y, GRID, inner_folds=3, max_iter=1000, seed=0)
    assert C_easy == min(GRID) and accuracy_easy.min() == 1.0
    z = 10.0 * rng.normal(size=n)
    x1 = z + (2 * y - 1) + 0.1 * rng.normal(size=n)
    mixed = np.column_stack([x1, z, rng.normal(size=(n, 3))])
    C_mixed, accuracy_mixed = select_C(mixed, y, GRID, inner_folds=3, max_iter=1000, seed=0)
    assert C_mixed >= 1.0 and accuracy_mixed.max() > accuracy_mixed[0] + 0.2


def test_no_test_fold_row_influences_that_folds_C_or_the_interval_rows() -> None:
    """Garbage in the first outer test fold changes that fold's accuracy, never its chosen C."""
    pairs, labels = _pairs(n=120, seed=4, noise=1.0)
    clean = probe(pairs, labels, 11, folds=3)
    train, test = next(StratifiedKFold(3, shuffle=True, random_state=11).split(pairs, labels))
    spoiled = pairs.copy()
    spoiled[test] = np.random.default_rng(9).normal(scale=50.0, size=spoiled[test].shape)
    dirty = probe(spoiled, labels, 11, folds=3)
    assert dirty["fold_C"][0] == clean["fold_C"][0]
    expected, _ = select_C(
        pair_features(pairs[train]),
        labels[train],
        GRID,
        inner_folds=3,
        max_iter=1000,
        seed=11,
    )
    assert clean["fold_C"][0] == expected


def test_fixed_seed_is_deterministic_and_seed_changes_folds() -> None:
    pairs, labels = _pairs(n=60, seed=4)
    labels = np.random.default_rng(5).permutation(labels)
    first = probe(pairs, labels, 11, folds=3)
    assert probe(pairs, labels, 11, folds=3) == first
    others = [probe(pairs, labels, s, folds=3)["fold_accuracy"] for s in (1, 2)]
    assert any(o != first["fold_accuracy"] for o in others)


@pytest.mark.parametrize(
    ("pairs", "labels", "options", "message"),
    [
        (np.ones((10, 3, 2)), np.tile([0, 1], 5), {"folds": 2}, r"\(n_pairs, 2, d\)"),
        (np.ones((10, 2, 2)), np.tile([0, 1], 4), {"folds": 2}, "labels must be"),
        (np.ones((10, 2, 2)), np.tile([0, 2], 5), {"folds": 2}, "0 \\(different\\) or 1"),
        (np.ones((10, 2, 2)), np.array([1] * 8 + [0] * 2), {"folds": 3}, "smaller class has 2"),
        (np.full((10, 2, 2), np.nan), np.tile([0, 1], 5), {"folds": 2}, "NaN"),
        (np.ones((20, 2, 2)), np.tile([0, 1], 10), {"folds": 2, "inner_folds": 6}, "has 5 there"),
        (np.ones((20, 2, 2)), np.tile([0, 1], 10), {"folds": 2, "Cs": [0.0]}, "C grid"),
        (np.ones((20, 2, 2)), np.tile([0, 1], 10), {"folds": 2, "Cs": []}, "C grid"),
    ],
)
def test_bad_input_is_rejected(pairs, labels, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        probe(pairs, labels, 0, **options)
