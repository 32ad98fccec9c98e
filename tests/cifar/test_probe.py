"""Linear probe: near 100% on linearly separable features, chance on shuffled labels."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from repdiag.cifar.probe import LinearProbeSettings, linear_probe
from repdiag.core.errors import ConfigError

SCHEMA = LinearProbeSettings.from_config({})  # the schema's cifar.probe: C 1, 1000 iterations


def _blobs(n: int, n_classes: int, dim: int, rng: np.random.Generator, separation: float):
    centres = separation * rng.standard_normal((n_classes, dim))
    labels = rng.integers(0, n_classes, n)
    return centres[labels] + rng.standard_normal((n, dim)), labels


def test_linearly_separable_features_are_classified_almost_perfectly() -> None:
    rng = np.random.default_rng(0)
    x, y = _blobs(1200, 10, 32, rng, separation=4.0)
    result = linear_probe(x[:800], y[:800], x[800:], y[800:], SCHEMA)
    assert result.accuracy >= 0.99 and result.train_accuracy >= 0.99
    assert result.chance == pytest.approx(0.1) and result.n_classes == 10
    assert (result.n_train, result.n_test) == (800, 400) and result.converged


def test_a_halfspace_with_margin_is_learned_without_standardisation() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal(16)
    x = rng.standard_normal((3000, 16))
    margin = x @ w / np.linalg.norm(w)
    x, y = x[np.abs(margin) > 0.2], (margin[np.abs(margin) > 0.2] > 0).astype(int)
    result = linear_probe(
        x[:1500], y[:1500], x[1500:], y[1500:], replace(SCHEMA, C=100.0, standardize=False)
    )
    assert result.accuracy >= 0.98 and result.chance == 0.5


def test_shuffled_labels_give_chance() -> None:
    rng = np.random.default_rng(2)
    x, y = _blobs(3000, 10, 32, rng, separation=4.0)
    shuffled = rng.permutation(y)
    result = linear_probe(
        x[:2000], shuffled[:2000], x[2000:], shuffled[2000:], replace(SCHEMA, C=0.01)
    )
    # 1000 test images: the standard error at chance is sqrt(0.1 * 0.9 / 1000) ~ 0.0095
    assert abs(result.accuracy - 0.1) < 0.04


def test_bad_inputs_are_refused() -> None:
    x = np.zeros((10, 4))
    with pytest.raises(ConfigError, match="two classes"):
        linear_probe(x, np.zeros(10), x, np.zeros(10), SCHEMA)
    with pytest.raises(ConfigError, match="features"):
        linear_probe(x, np.arange(10) % 2, np.zeros((10, 5)), np.arange(10) % 2, SCHEMA)
