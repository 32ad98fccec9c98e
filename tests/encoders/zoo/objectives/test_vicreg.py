"""VICReg against numpy and the variance hinge in closed form (Bardes et al. 2022)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repdiag.encoders.zoo.objectives.vicreg import vicreg_loss
from tests.encoders.zoo.objectives.reference import fixed, t


def vicreg_reference(z1, z2, lam, mu, nu, gamma):
    d = z1.shape[1]
    invariance = np.mean((z1 - z2) ** 2)

    def var_term(z):
        return np.mean(
            [max(0.0, gamma - math.sqrt(np.var(z[:, j], ddof=1) + 1e-4)) for j in range(d)]
        )

    def cov_term(z):
        c = np.cov(z, rowvar=False)  # unbiased
        return sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / d

    return (
        lam * invariance
        + mu * (var_term(z1) + var_term(z2)) / 2
        + nu * (cov_term(z1) + cov_term(z2))
    )


def test_vicreg_matches_numpy():
    z1, z2 = 0.3 * fixed(12, 5, seed=4), 0.3 * fixed(12, 5, seed=5)  # std < 1: the hinge is active
    expected = vicreg_reference(z1, z2, 25.0, 25.0, 1.0, 1.0)
    got = vicreg_loss(t(z1), t(z2), 25.0, 25.0, 1.0, 1.0).item()
    assert got == pytest.approx(expected, rel=1e-10)


def test_vicreg_variance_hinge_closed_form():
    # identical views, uncorrelated columns with std 2 > gamma: only the covariance term is left,
    # and it is 0 for exactly decorrelated columns
    z = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]]) * math.sqrt(3 / 8)
    assert np.allclose(np.cov(z, rowvar=False), np.eye(2))
    assert vicreg_loss(t(z), t(z), 25.0, 25.0, 1.0, gamma=0.5).item() == pytest.approx(
        0.0, abs=1e-12
    )
    # gamma = 2: each of the 2 dims misses by 2 - sqrt(1 + 1e-4); both views: (v + v) / 2 = v
    expected = 25.0 * (2 - math.sqrt(1 + 1e-4))
    assert vicreg_loss(t(z), t(z), 25.0, 25.0, 1.0, gamma=2.0).item() == pytest.approx(
        expected, rel=1e-10
    )
