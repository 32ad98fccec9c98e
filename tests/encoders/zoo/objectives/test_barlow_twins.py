"""The Barlow Twins loss against the double sum of Zbontar et al. (2021) and a closed form."""

from __future__ import annotations

import numpy as np
import pytest

from repdiag.encoders.zoo.objectives.barlow_twins import barlow_twins_loss
from tests.encoders.zoo.objectives.reference import fixed, t


def barlow_reference(z1: np.ndarray, z2: np.ndarray, lam: float) -> float:
    n, d = z1.shape
    a = (z1 - z1.mean(0)) / np.sqrt(z1.var(0) + 1e-5)
    b = (z2 - z2.mean(0)) / np.sqrt(z2.var(0) + 1e-5)
    total = 0.0
    for i in range(d):
        for j in range(d):
            c_ij = sum(a[k, i] * b[k, j] for k in range(n)) / n
            total += (1 - c_ij) ** 2 if i == j else lam * c_ij**2
    return total


def test_barlow_twins_matches_the_double_sum():
    z1, z2 = fixed(10, 6, seed=1), fixed(10, 6, seed=2)
    expected = barlow_reference(z1, z2, 0.0051)
    assert barlow_twins_loss(t(z1), t(z2), 0.0051).item() == pytest.approx(expected, rel=1e-10)


def test_barlow_twins_is_zero_for_identical_decorrelated_views():
    # 7 orthonormal columns orthogonal to the ones vector (eigenvectors of the centring matrix),
    # scaled to biased variance 1: C = I / (1 + 1e-5), so L = 7 (1 - 1 / (1 + 1e-5))^2 ~ 7e-10
    u, _, _ = np.linalg.svd(np.eye(8) - 1 / 8)
    z = u[:, :7] * np.sqrt(8)
    assert np.allclose(z.mean(0), 0) and np.allclose(z.var(0), 1)
    expected = 7 * (1 - 1 / (1 + 1e-5)) ** 2
    assert barlow_twins_loss(t(z), t(z), 1.0).item() == pytest.approx(expected, rel=1e-6)
