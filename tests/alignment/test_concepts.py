"""Synthetic paired concepts (repdiag.alignment.concepts)."""

from __future__ import annotations

import numpy as np
import pytest

from repdiag.alignment.concepts import (
    SyntheticConcepts,
    n_paired_rows,
    random_map,
    sample_concepts,
    synthetic_pairs,
)
from repdiag.core.errors import ConfigError

SMALL = dict(
    n_concepts=6,
    k_active=2,
    dims=[5, 7],
    maps=["linear", "nonlinear"],
    nonlinearity=0.5,
    noise=0.0,
    n_train=400,
    n_test=50,
)


def test_concepts_have_exactly_k_active_with_magnitudes_in_range():
    z = sample_concepts(1000, 9, 3, np.random.default_rng(0), correlation=0.0)
    assert np.all(np.count_nonzero(z, axis=1) == 3)
    active = z[z != 0]
    assert active.min() >= 0.5 and active.max() <= 1.5
    # every concept is used about equally often: 1000 * 3 / 9 = 333 each
    assert np.all(np.abs(np.count_nonzero(z, axis=0) - 333.3) < 60)


def test_k_active_above_n_concepts_is_a_config_error():
    with pytest.raises(ConfigError, match="k_active"):
        sample_concepts(5, 3, 4, np.random.default_rng(0), correlation=0.0)


@pytest.mark.parametrize(
    ("fraction", "rows", "expected"),
    [(0.001, 131072, 131), (0.01, 2000, 20), (1.0, 50, 50), (1e-6, 100, 1), (0.0, 100, 0)],
)
def test_paired_rows(fraction, rows, expected):
    assert n_paired_rows(fraction, rows) == expected


def test_paired_fraction_outside_unit_interval_is_rejected():
    with pytest.raises(ConfigError, match="paired fraction"):
        n_paired_rows(1.5, 10)


def test_maps_are_the_stated_closed_forms():
    rng = np.random.default_rng(1)
    z = sample_concepts(20, 6, 2, rng, correlation=0.0)
    linear = random_map(5, 6, "linear", 0.5, rng)
    nonlinear = random_map(5, 6, "nonlinear", 0.5, rng)
    np.testing.assert_allclose(np.linalg.norm(linear.dictionary, axis=0), 1.0, rtol=1e-6)
    h = z @ nonlinear.dictionary.T
    np.testing.assert_allclose(linear(z), z @ linear.dictionary.T, rtol=1e-6)
    np.testing.assert_allclose(nonlinear(z), h + 0.5 * np.tanh(h), rtol=1e-6)
    with pytest.raises(ConfigError, match="unknown domain map"):
        random_map(5, 6, "cubic", 0.5, rng)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dims": (5,)}, "dims and .maps must each list two domains"),
        ({"maps": ("linear", "linear", "linear")}, "dims and .maps must each list two domains"),
        ({"n_specific": -1}, "n_specific must be >= 0"),
    ],
)
def test_synthetic_space_refuses_a_domain_count_other_than_two_and_negative_private_concepts(
    change, message
):
    with pytest.raises(ConfigError, match=message):
        SyntheticConcepts.from_config(dict(**{**SMALL, **change}))


def test_synthetic_space_from_config_holds_tuples_and_equals_one_built_from_lists():
    space = SyntheticConcepts.from_config(SMALL)
    assert space.dims == (5, 7) and space.maps == ("linear", "nonlinear")
    assert space == SyntheticConcepts.from_config(
        dict(**{**SMALL, "dims": (5, 7), "maps": ("linear", "nonlinear")})
    )


def test_synthetic_pairs_share_concepts_only_on_paired_rows():
    data = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=0.1, seed=3
    )
    z_a, z_b = data.train_concepts
    assert data.n_paired == 40
    np.testing.assert_array_equal(z_a[:40], z_b[:40])
    # unpaired rows are independent draws: almost none coincide
    assert np.mean(np.all(z_a[40:] == z_b[40:], axis=1)) < 0.2
    # noiseless: the linear domain is exactly W z, for train and test
    w = np.linalg.lstsq(z_a, data.train[0], rcond=None)[0]
    np.testing.assert_allclose(z_a @ w, data.train[0], atol=1e-4)
    np.testing.assert_allclose(data.test_concepts @ w, data.test[0], atol=1e-4)
    assert data.train[0].shape == (400, 5) and data.test[1].shape == (50, 7)
    np.testing.assert_array_equal(data.test_labels, np.argmax(data.test_concepts, axis=1))


def test_fraction_changes_pairing_not_the_domains():
    few = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=0.01, seed=5
    )
    full = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=1.0, seed=5
    )
    np.testing.assert_array_equal(few.test[0], full.test[0])
    np.testing.assert_array_equal(few.test[1], full.test[1])
    np.testing.assert_array_equal(few.train[0], full.train[0])
    assert few.n_paired == 4 and full.n_paired == 400


def test_noise_has_the_stated_relative_size():
    clean = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=1.0, seed=2
    )
    noisy = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**{**SMALL, "noise": 0.1})), paired_fraction=1.0, seed=2
    )
    residual = noisy.train[0] - clean.train[0]
    rms = np.sqrt(np.mean(clean.train[0] ** 2))
    assert residual.std() == pytest.approx(0.1 * rms, rel=0.05)


def test_test_split_noise_is_identical_across_paired_fractions():
    noisy = {**SMALL, "noise": 0.1}
    runs = [
        synthetic_pairs(SyntheticConcepts.from_config(dict(**noisy)), paired_fraction=f, seed=7)
        for f in (0.001, 0.01, 0.3, 1.0)
    ]
    for run in runs[1:]:
        for domain in (0, 1):
            np.testing.assert_array_equal(run.test[domain], runs[0].test[domain])
        # domain a's training rows (concepts and noise) do not depend on the pairing either
        np.testing.assert_array_equal(run.train[0], runs[0].train[0])
    # the noise is really there, and the test noise is not the training noise
    clean = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=1.0, seed=7
    )
    test_noise = runs[0].test[1] - clean.test[1]
    assert test_noise.std() > 0.01
    train_noise = runs[0].train[1][: len(test_noise)] - clean.train[1][: len(test_noise)]
    assert not np.allclose(test_noise, train_noise)


def test_truth_change_is_the_concept_effect_and_counterfactuals_remove_it():
    data = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=1.0, seed=4
    )
    truth = data.truth
    rows = np.flatnonzero(truth.concepts[:, 2] > 0)
    for domain in (0, 1):
        change = truth.change(domain, rows, 2)
        z = truth.concepts[rows].copy()
        z[:, 2] = 0.0
        np.testing.assert_allclose(
            data.test[domain][rows] - change, truth.maps[domain](z), atol=1e-5
        )
    assert list(truth.shared) == list(range(6))


def test_hard_testbed_power_law_correlation_and_private_concepts():
    hard = {
        **SMALL,
        "n_train": 20000,
        "frequency_exponent": 1.0,
        "correlation": 0.6,
        "n_specific": 2,
    }
    data = synthetic_pairs(SyntheticConcepts.from_config(dict(**hard)), paired_fraction=1.0, seed=0)
    z = data.train_concepts[0]
    assert z.shape[1] == 10 and np.all(np.count_nonzero(z, axis=1) == 2)
    frequency = np.sort(np.mean(z > 0, axis=0))[::-1]
    assert frequency[0] > 3 * frequency[-1]  # power law: frequent and rare concepts
    truth = data.truth
    assert list(truth.shared) == list(range(6))
    assert list(np.flatnonzero(truth.present[0] & ~truth.present[1])) == [6, 7]
    assert list(np.flatnonzero(truth.present[1] & ~truth.present[0])) == [8, 9]
    # a private concept is invisible in the other domain
    np.testing.assert_array_equal(truth.maps[0].dictionary[:, 8:], 0.0)
    np.testing.assert_array_equal(truth.maps[1].dictionary[:, 6:8], 0.0)
    # correlated pairs (0, 1), (2, 3), ... co-occur more often than independent draws would
    uniform = sample_concepts(20000, 10, 2, np.random.default_rng(0), correlation=0.0)
    correlated = sample_concepts(20000, 10, 2, np.random.default_rng(0), correlation=0.6)

    def together(codes):
        active = codes > 0
        return np.mean(active[:, 0::2] & active[:, 1::2])

    assert together(correlated) > 1.5 * together(uniform)
