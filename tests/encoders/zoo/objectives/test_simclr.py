"""NT-Xent against the per-anchor loop and its closed form for orthogonal anchors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss
from tests.encoders.zoo.objectives.reference import fixed, t


def nt_xent_reference(z1, z2, tau):
    z = np.concatenate([z1, z2])
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    m, n = len(z), len(z1)
    losses = []
    for i in range(m):
        j = (i + n) % m
        denom = sum(math.exp(z[i] @ z[k] / tau) for k in range(m) if k != i)
        losses.append(-math.log(math.exp(z[i] @ z[j] / tau) / denom))
    return float(np.mean(losses))


def test_nt_xent_matches_the_per_anchor_loop():
    z1, z2 = fixed(6, 4, seed=6), fixed(6, 4, seed=7)
    assert nt_xent_loss(t(z1), t(z2), 0.2).item() == pytest.approx(
        nt_xent_reference(z1, z2, 0.2), rel=1e-10
    )


def test_nt_xent_closed_form_for_orthogonal_anchors():
    # identical views of n orthonormal vectors: positive similarity 1, the other 2n - 2 are 0
    n, tau = 3, 0.5
    z = np.eye(n)
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2 * n - 2))
    assert nt_xent_loss(t(z), t(z), tau).item() == pytest.approx(expected, rel=1e-12)
