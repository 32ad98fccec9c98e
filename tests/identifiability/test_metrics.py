"""Identifiability metrics: closed forms (orthogonal maps, permutations, rotations) and hand cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import special_ortho_group
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score

from repdiag.identifiability.metrics import (
    ape,
    correlation_matrix,
    identifiability_metrics,
    linear_r2,
    mcc,
    r2_scores,
    split_indices,
)
from repdiag.identifiability.sphere import sample_uniform


def sphere(n: int = 1000, seed: int = 0) -> np.ndarray:
    return sample_uniform(n, 3, np.random.default_rng(seed))


def rotation(seed: int = 1) -> np.ndarray:
    return special_ortho_group.rvs(3, random_state=seed)


def test_orthogonal_map_has_r2_one_and_ape_zero() -> None:
    z = sphere()
    for q in (rotation(), rotation(2) @ np.diag([1, 1, -1])):  # a rotation and a reflection
        h = z @ q.T
        assert linear_r2(h, z, 0.5, seed=0) == pytest.approx(1.0, abs=1e-12)
        assert ape(h, z) == pytest.approx(0.0, abs=1e-12)


def test_signed_permutation_has_mcc_one() -> None:
    z = sphere()
    h = z[:, [2, 0, 1]] * [-1, 1, -1]
    assert mcc(h, z) == pytest.approx(1.0, abs=1e-12)
    assert ape(h, z) == pytest.approx(0.0, abs=1e-12)


def test_hand_computed_r2() -> None:
    """Fit z = 2 h on h = 0, 1, 2; test on h = 3, 4 with z = 6, 9: predictions 6, 8,
    residual 1, total (1.5^2 + 1.5^2) = 4.5 -> R^2 = 1 - 1/4.5."""
    scores = r2_scores(
        np.array([[0.0], [1.0], [2.0]]),
        np.array([[0.0], [2.0], [4.0]]),
        np.array([[3.0], [4.0]]),
        np.array([[6.0], [9.0]]),
    )
    assert scores == pytest.approx([1 - 1 / 4.5])


def test_r2_matches_scikit_learn() -> None:
    z = sphere(600)
    h = np.tanh(2 * z @ rotation(3).T) + 0.05 * np.random.default_rng(4).standard_normal((600, 3))
    train, test = split_indices(600, 0.5, seed=5)
    model = LinearRegression().fit(h[train], z[train])
    expected = r2_score(z[test], model.predict(h[test]), multioutput="uniform_average")
    assert linear_r2(h, z, 0.5, seed=5) == pytest.approx(expected, rel=1e-10)


def test_r2_is_zero_for_independent_noise_and_lower_for_a_folded_map() -> None:
    z = sphere(4000)
    noise = np.random.default_rng(6).standard_normal((4000, 3))
    assert abs(linear_r2(noise, z, 0.5, seed=0)) < 0.01
    folded = np.abs(z)  # |z| carries no linear information about z (E[z | |z|] = 0)
    assert linear_r2(folded, z, 0.5, seed=0) < 0.05


def test_hand_computed_mcc() -> None:
    """z = (x, u), h = (u, y) with corr(x, y) = 0.8 and u uncorrelated with both: MCC = (1 + 0.8)/2."""
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([1.0, 3.0, 2.0, 4.0])
    u = np.array([1.0, -1.0, -1.0, 1.0])
    z, h = np.stack([x, u], 1), np.stack([u, y], 1)
    np.testing.assert_allclose(
        np.abs(correlation_matrix(h, z)), [[0.0, 1.0], [0.8, 0.0]], atol=1e-12
    )
    assert mcc(h, z) == pytest.approx(0.9)


def test_hand_computed_ape() -> None:
    """z = e1, e2 (inner product 0); h = e1, (e1 + e2)/sqrt 2 (inner product 1/sqrt 2)."""
    z = np.array([[1.0, 0.0], [0.0, 1.0]])
    h = np.array([[1.0, 0.0], [1 / math.sqrt(2), 1 / math.sqrt(2)]])
    assert ape(h, z) == pytest.approx(1 / math.sqrt(2))
    # three points: pairs (0,1), (0,2), (1,2) with errors 1/sqrt2, 0, 1/sqrt2 ... averaged
    z3 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    h3 = np.array([[1.0, 0.0], [1 / math.sqrt(2), 1 / math.sqrt(2)], [1.0, 0.0]])
    assert ape(h3, z3) == pytest.approx((2 / math.sqrt(2) + 0) / 3)


def test_a_stretch_is_penalised_by_ape_and_mcc_not_r2() -> None:
    z = sphere()
    h = z * [3.0, 1.0, 1.0]
    h /= np.linalg.norm(h, axis=1, keepdims=True)
    metrics = identifiability_metrics(h, z, 0.5, seed=0)
    assert metrics["ape"] > 0.1 and 0.9 < metrics["r2"] < 1.0 and metrics["mcc"] > 0.9


def test_split_is_seeded_disjoint_and_complete() -> None:
    train, test = split_indices(10, 0.6, seed=1)
    assert len(train) == 6 and len(test) == 4
    assert sorted(np.concatenate([train, test])) == list(range(10))
    np.testing.assert_array_equal(train, split_indices(10, 0.6, seed=1)[0])
    with pytest.raises(ValueError, match="train_fraction"):
        split_indices(10, 1.0, seed=1)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same n"):
        mcc(np.zeros((4, 3)), np.zeros((5, 3)))


def test_ape_is_over_pairs_i_below_j_not_all_pairs_halved() -> None:
    """Ours averages the n(n-1)/2 pairs i < j; (1/(2 n^2)) sum over all n^2 pairs is (n-1)/(2n) of it."""
    z, h = sphere(50, 3), sphere(50, 4)
    errors = np.abs(z @ z.T - h @ h.T)
    n = len(z)
    pairs = [errors[i, j] for i in range(n) for j in range(i + 1, n)]
    assert ape(h, z) == pytest.approx(np.mean(pairs))
    all_halved = errors.sum() / (2 * n**2)
    assert all_halved == pytest.approx((n - 1) / (2 * n) * ape(h, z))


def test_per_coordinate_r2_sees_which_latent_survives() -> None:
    """h keeps z_1 and replaces z_2, z_3 by independent noise: r2_z1 = 1, r2_z2 = r2_z3 ~ 0."""
    z = sphere(4000)
    noise = np.random.default_rng(7).standard_normal((4000, 2))
    h = np.column_stack([z[:, 0], noise])
    metrics = identifiability_metrics(h, z, 0.5, seed=0)
    assert metrics["r2_z1"] == pytest.approx(1.0, abs=1e-12)
    assert abs(metrics["r2_z2"]) < 0.01 and abs(metrics["r2_z3"]) < 0.01
    mean = np.mean([metrics[f"r2_z{j}"] for j in (1, 2, 3)])
    assert metrics["r2"] == pytest.approx(mean)
