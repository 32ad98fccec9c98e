"""Geometry metrics: closed forms, and independent plain-numpy computations on small arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repdiag.binding.metrics import geometry as geo


def _loop_covariance_eigenvalues(x: np.ndarray) -> np.ndarray:
    """Covariance by explicit sums over samples, eigenvalues by numpy's general eig."""
    n, d = x.shape
    mean = [sum(x[i, j] for i in range(n)) / n for j in range(d)]
    cov = np.zeros((d, d))
    for i in range(n):
        for a in range(d):
            for b in range(d):
                cov[a, b] += (x[i, a] - mean[a]) * (x[i, b] - mean[b]) / (n - 1)
    values = np.linalg.eig(cov)[0].real
    return np.sort(np.clip(values, 0, None))[::-1]


def _loop_local_isotropy(x: np.ndarray, k: int) -> float:
    n = x.shape[0]
    scores = []
    for i in range(n):
        dists = sorted((float(np.sum((x[i] - x[j]) ** 2)), j) for j in range(n) if j != i)
        nbrs = x[[j for _, j in dists[:k]]]
        values = _loop_covariance_eigenvalues(nbrs)
        scores.append(1.0 - values[0] / values.sum())
    return sum(scores) / n


@pytest.fixture
def small() -> np.ndarray:
    rng = np.random.default_rng(3)
    return rng.normal(size=(12, 4)) * np.array([3.0, 1.0, 0.5, 0.2])


def test_isotropic_gaussian_closed_forms() -> None:
    d = 8
    x = np.random.default_rng(0).normal(size=(40_000, d))
    assert geo.global_participation_ratio(x) == pytest.approx(1.0, abs=0.01)
    assert geo.global_isotropy(x) == pytest.approx(1.0 - 1.0 / d, abs=0.01)
    assert geo.participation_ratio(x) == pytest.approx(d, rel=0.01)
    assert geo.effective_rank(x) == pytest.approx(d, rel=0.01)


def test_rank_one_closed_forms() -> None:
    d = 10
    rng = np.random.default_rng(1)
    direction = rng.normal(size=d)
    x = rng.normal(size=(500, 1)) * direction + 5.0  # offset: centring must remove it
    assert geo.global_participation_ratio(x) == pytest.approx(1.0 / d, rel=1e-6)
    assert geo.global_isotropy(x) == pytest.approx(0.0, abs=1e-9)
    assert geo.effective_rank(x) == pytest.approx(1.0, rel=1e-6)
    assert geo.participation_ratio(x) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("r", [1, 3, 7])
def test_effective_rank_of_equal_values_is_their_count(r: int) -> None:
    spectrum = np.concatenate([np.full(r, 2.5), np.zeros(5)])
    assert geo.effective_rank_of_spectrum(spectrum) == pytest.approx(r, rel=1e-12)
    assert geo.participation_ratio_of_spectrum(spectrum) == pytest.approx(r, rel=1e-12)


def test_effective_rank_matches_entropy_loop() -> None:
    spectrum = np.array([4.0, 2.0, 1.0, 0.5, 0.0])
    p = [s / sum(spectrum) for s in spectrum if s > 0]
    expected = math.exp(-sum(pi * math.log(pi) for pi in p))
    assert geo.effective_rank_of_spectrum(spectrum) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("shape", [(12, 4), (5, 9)])  # covariance path and Gram path
def test_spectrum_matches_loop(shape: tuple[int, int]) -> None:
    x = np.random.default_rng(2).normal(size=shape)
    expected = _loop_covariance_eigenvalues(x)[: min(shape)]
    np.testing.assert_allclose(geo.covariance_spectrum(x), expected, atol=1e-10)


def test_global_metrics_match_loop(small: np.ndarray) -> None:
    values = _loop_covariance_eigenvalues(small)
    d = small.shape[1]
    assert geo.global_participation_ratio(small) == pytest.approx(
        values.sum() ** 2 / (d * (values**2).sum()), rel=1e-10
    )
    assert geo.global_isotropy(small) == pytest.approx(1 - values[0] / values.sum(), rel=1e-10)
    assert geo.participation_ratio(small) == pytest.approx(
        values.sum() ** 2 / (values**2).sum(), rel=1e-10
    )
    s = np.sqrt(values)
    p = s / s.sum()
    assert geo.effective_rank(small) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-10)


@pytest.mark.parametrize("k", [3, 5, 8])
def test_local_isotropy_matches_loop(small: np.ndarray, k: int) -> None:
    assert geo.local_isotropy(small, k) == pytest.approx(_loop_local_isotropy(small, k), rel=1e-9)


def test_local_isotropy_with_more_neighbours_than_dimensions() -> None:
    x = np.random.default_rng(4).normal(size=(15, 2))  # k > d: covariance path
    assert geo.local_isotropy(x, 6) == pytest.approx(_loop_local_isotropy(x, 6), rel=1e-9)


def test_local_isotropy_of_points_on_a_line_is_zero() -> None:
    t = np.random.default_rng(5).uniform(size=(30, 1))
    x = np.hstack([t, 2 * t, -t])
    assert geo.local_isotropy(x, 5) == pytest.approx(0.0, abs=1e-9)


def test_metrics_are_scale_and_translation_invariant(small: np.ndarray) -> None:
    moved = 7.0 * small - 3.0
    for metric in (geo.global_participation_ratio, geo.global_isotropy, geo.effective_rank):
        assert metric(moved) == pytest.approx(metric(small), rel=1e-9)
    assert geo.local_isotropy(moved, 4) == pytest.approx(geo.local_isotropy(small, 4), rel=1e-9)


def test_collapsed_set_gives_zeros_not_nan() -> None:
    x = np.ones((10, 3))
    result = geo.geometry_metrics(x, l_iso_k=[3])
    assert result == {
        "g_pr": 0.0,
        "g_iso": 0.0,
        "l_iso": {"3": 0.0},
        "effective_rank": 0.0,
        "participation_ratio": 0.0,
    }


def test_geometry_metrics_keys_and_agreement(small: np.ndarray) -> None:
    result = geo.geometry_metrics(small, l_iso_k=[3, 5])
    assert result["g_pr"] == pytest.approx(geo.global_participation_ratio(small))
    assert result["g_iso"] == pytest.approx(geo.global_isotropy(small))
    assert result["l_iso"] == {
        "3": pytest.approx(geo.local_isotropy(small, 3)),
        "5": pytest.approx(geo.local_isotropy(small, 5)),
    }


def test_knn_indices_match_brute_force() -> None:
    rng = np.random.default_rng(6)
    pts, ref = rng.normal(size=(7, 3)), rng.normal(size=(20, 3))
    for metric in ("euclidean", "cosine"):
        got = geo.knn_indices(pts, ref, 4, metric=metric)
        if metric == "cosine":
            sims = (pts / np.linalg.norm(pts, axis=1, keepdims=True)) @ (
                ref / np.linalg.norm(ref, axis=1, keepdims=True)
            ).T
            expected = np.argsort(-sims, axis=1)[:, :4]
        else:
            expected = np.argsort(((pts[:, None] - ref[None]) ** 2).sum(-1), axis=1)[:, :4]
        np.testing.assert_array_equal(got, expected)


def test_knn_excluding_self_never_returns_self() -> None:
    x = np.random.default_rng(7).normal(size=(25, 4))
    idx = geo.knn_indices(x, x, 24, exclude_self=True)
    assert not np.any(idx == np.arange(25)[:, None])
    assert all(len(set(row)) == 24 for row in idx)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: geo.global_isotropy(np.ones(5)), "shape"),
        (lambda: geo.global_isotropy(np.ones((1, 5))), "at least 2"),
        (lambda: geo.global_isotropy(np.array([[0.0, np.nan], [1.0, 2.0]])), "NaN"),
        (lambda: geo.local_isotropy(np.ones((5, 2)), 5), "k=5"),
        (lambda: geo.local_isotropy(np.ones((5, 2)), 1), "k >= 2"),
    ],
)
def test_bad_input_is_rejected(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
