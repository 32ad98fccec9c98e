"""Readouts and binding accuracy: loop re-implementations, tie rule, interval, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from repdiag.errors import RegistryError
from repdiag.metrics import readouts as ro


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _loop_knn_score(q, c, ref, k, weights):
    def affinity(x):
        sims = [_cos(x, r) for r in ref]
        nbrs = sorted(range(len(ref)), key=lambda j: -sims[j])[:k]
        vec = np.zeros(len(ref))
        for j in nbrs:
            vec[j] = 1.0 if weights == "binary" else (1 + sims[j]) / 2
        return vec

    return _cos(affinity(q), affinity(c))


def _loop_local_pca_score(q, c, ref, k, dim):
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    q, c = unit(q), unit(c)
    ref = np.array([unit(r) for r in ref])
    nbrs = sorted(range(len(ref)), key=lambda j: -float(q @ ref[j]))[:k]
    hood = ref[nbrs]
    mean = hood.mean(axis=0)
    cov = (hood - mean).T @ (hood - mean)
    basis = np.linalg.eigh(cov)[1][:, ::-1][:, :dim]  # top-dim eigenvectors, independent of SVD
    return _cos(basis.T @ (q - mean), basis.T @ (c - mean))


@pytest.fixture
def task() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "query": rng.normal(size=(6, 5)),
        "candidates": rng.normal(size=(6, 4, 5)),
        "reference": rng.normal(size=(30, 5)),
    }


def test_registry_names_the_three_readouts() -> None:
    assert ro.READOUTS.names() == ["cosine", "knn", "local_pca"]
    with pytest.raises(RegistryError, match="cosine, knn, local_pca"):
        ro.READOUTS.get("euclid")


def test_cosine_matches_loop(task) -> None:
    scores = ro.readout_scores(task["query"], task["candidates"], "cosine")
    for i in range(6):
        for j in range(4):
            assert scores[i, j] == pytest.approx(_cos(task["query"][i], task["candidates"][i, j]))


@pytest.mark.parametrize("weights", ["binary", "similarity"])
def test_knn_matches_loop(task, weights: str) -> None:
    scores = ro.readout_scores(
        task["query"], task["candidates"], "knn", task["reference"], k=7, weights=weights
    )
    for i in range(6):
        for j in range(4):
            expected = _loop_knn_score(
                task["query"][i], task["candidates"][i, j], task["reference"], 7, weights
            )
            assert scores[i, j] == pytest.approx(expected, abs=1e-12)


def test_knn_binary_is_the_shared_neighbour_fraction(task) -> None:
    scores = ro.readout_scores(
        task["query"], task["candidates"], "knn", task["reference"], k=5, weights="binary"
    )
    np.testing.assert_allclose(scores * 5, np.round(scores * 5), atol=1e-12)  # multiples of 1/k


def test_local_pca_matches_loop(task) -> None:
    scores = ro.readout_scores(
        task["query"], task["candidates"], "local_pca", task["reference"], k=8, dim=3
    )
    for i in range(6):
        for j in range(4):
            expected = _loop_local_pca_score(
                task["query"][i], task["candidates"][i, j], task["reference"], 8, 3
            )
            assert scores[i, j] == pytest.approx(expected, abs=1e-9)


def test_local_pca_ignores_directions_outside_the_neighbourhood() -> None:
    """The correct candidate differs from the query only off the local subspace: cosine fails."""
    rng = np.random.default_rng(1)
    d = 10
    base = np.eye(d)[0]
    reference = base + rng.normal(size=(40, 2)) @ np.eye(d)[1:3] * 0.1
    query = base + 0.05 * np.eye(d)[1]
    correct = query + 0.5 * np.eye(d)[5]  # large nuisance shift outside span(e1, e2)
    distractor = base - 0.05 * np.eye(d)[1]
    candidates = np.stack([distractor, correct])[None]
    cos = ro.binding_accuracy(query[None], candidates, np.array([1]))
    pca = ro.binding_accuracy(
        query[None], candidates, np.array([1]), "local_pca", reference, k=10, dim=2
    )
    assert (cos["accuracy"], pca["accuracy"]) == (0.0, 1.0)


def test_exact_copies_are_found_by_every_readout(task) -> None:
    rng = np.random.default_rng(2)
    correct = rng.integers(0, 4, size=6)
    candidates = task["candidates"].copy()
    candidates[np.arange(6), correct] = task["query"]
    options = {"cosine": {}, "knn": {"k": 6}, "local_pca": {"k": 8, "dim": 4}}
    for name, opts in options.items():
        result = ro.binding_accuracy(
            task["query"], candidates, correct, name, task["reference"], **opts
        )
        assert result["accuracy"] == 1.0, name


def test_accuracy_is_the_fraction_of_strict_winners() -> None:
    scores = np.array(
        [
            [0.9, 0.1, 0.2],  # hit
            [0.5, 0.5, 0.1],  # tie at the top: miss
            [0.1, 0.3, 0.2],  # miss
            [0.1, 0.2, 0.3],  # hit (index 2)
            [np.nan, 0.0, 0.0],  # NaN: miss
        ]
    )
    hits = ro.hits_from_scores(scores, np.array([0, 0, 0, 2, 0]))
    np.testing.assert_array_equal(hits, [True, False, False, True, False])


def test_ties_are_misses_so_identical_candidates_score_zero() -> None:
    rng = np.random.default_rng(3)
    query = rng.normal(size=(50, 4))
    candidates = np.repeat(rng.normal(size=(50, 1, 4)), 8, axis=1)
    result = ro.binding_accuracy(query, candidates, rng.integers(0, 8, size=50))
    assert result["accuracy"] == 0.0
    assert result["chance"] == pytest.approx(1 / 8)


def test_result_fields_and_interval_match_scipy() -> None:
    rng = np.random.default_rng(4)
    query = rng.normal(size=(40, 3))
    candidates = rng.normal(size=(40, 5, 3))
    correct = rng.integers(0, 5, size=40)
    candidates[np.arange(25), correct[:25]] = query[:25]  # 25 sure hits, the rest random
    result = ro.binding_accuracy(query, candidates, correct)
    hits = int(ro.hits_from_scores(ro.readout_scores(query, candidates), correct).sum())
    assert result["hits"] == hits >= 25
    assert result["n"] == 40
    assert result["accuracy"] == hits / 40
    assert result["chance"] == 0.2
    assert result["ci_method"] == "wilson"
    ci = binomtest(hits, 40).proportion_ci(confidence_level=0.95, method="wilson")
    assert result["ci_low"] == pytest.approx(ci.low, abs=1e-12)
    assert result["ci_high"] == pytest.approx(ci.high, abs=1e-12)
    assert result["ci_low"] <= result["accuracy"] <= result["ci_high"]


@pytest.mark.parametrize(("hits", "n"), [(0, 10), (10, 10), (3, 17), (500, 1000)])
def test_wilson_interval_matches_scipy(hits: int, n: int) -> None:
    ci = binomtest(hits, n).proportion_ci(method="wilson")
    low, high = ro.wilson_interval(hits, n)
    assert (low, high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
    assert low <= hits / n <= high
    low99, high99 = ro.wilson_interval(hits, n, 0.99)
    assert low99 <= low and high <= high99  # a higher confidence level widens the interval
    assert (low99, high99) != (low, high)


def test_candidate_order_does_not_matter(task) -> None:
    correct = np.array([0, 1, 2, 3, 0, 1])
    base = ro.readout_scores(task["query"], task["candidates"], "knn", task["reference"], k=5)
    perm = np.array([2, 0, 3, 1])
    shuffled = ro.readout_scores(
        task["query"], task["candidates"][:, perm], "knn", task["reference"], k=5
    )
    np.testing.assert_allclose(shuffled, base[:, perm])
    inverse = np.argsort(perm)
    np.testing.assert_array_equal(
        ro.hits_from_scores(base, correct), ro.hits_from_scores(shuffled, inverse[correct])
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"readout": "knn"}, "needs a reference"),
        ({"readout": "knn", "reference": np.ones((3, 5)), "k": 4}, "k=4"),
        ({"readout": "knn", "reference": np.ones((9, 4))}, r"\(n, 5\) like the queries"),
        ({"readout": "local_pca", "reference": np.full((9, 5), np.inf)}, "reference holds NaN"),
        ({"readout": "knn", "reference": np.ones((9, 5)), "weights": "rank"}, "weights"),
        ({"readout": "local_pca", "reference": np.ones((9, 5)), "k": 4, "dim": 4}, "dim=4"),
        ({"correct_index": np.array([0, 0, 9])}, r"\[0, 2\)"),
        ({"correct_index": np.array([0.0, 0, 1])}, "integers"),
        ({"query_features": np.ones((3, 4))}, "n_queries"),
        ({"query_features": np.full((3, 5), np.nan)}, "query_features holds NaN"),
    ],
)
def test_bad_input_is_rejected(kwargs, message: str) -> None:
    args = {
        "query_features": np.ones((3, 5)),
        "candidate_features": np.arange(30.0).reshape(3, 2, 5),
        "correct_index": np.array([0, 1, 0]),
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        ro.binding_accuracy(**args)
