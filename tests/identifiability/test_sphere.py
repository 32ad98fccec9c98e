"""Sphere latents: exact vMF sampling, restricted support, sub-manifold negatives, generators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import iv

from repdiag.core.errors import ConfigError
from repdiag.identifiability.sphere import (
    GENERATORS,
    build_generator,
    condition_threshold,
    haar_rotation,
    sample_positives,
    sample_restricted,
    sample_submanifold_uniform,
    sample_uniform,
    sample_vmf,
    vmf_mean_cosine,
)

GENERATOR_PARAMS = {"linear": {"out_dim": 7}, "invertible_mlp": {"n_cond_samples": 2000}}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def generator(name: str, seed: int = 0):
    return build_generator(name, 3, seed, **GENERATOR_PARAMS.get(name, {}))


def test_uniform_samples_are_unit_vectors_with_zero_mean() -> None:
    z = sample_uniform(20000, 3, rng())
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-12)
    # each coordinate of a uniform point on S^2 is U(-1, 1): mean 0, variance 1/3
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=0.02)
    np.testing.assert_allclose(z.var(axis=0), 1 / 3, atol=0.01)


@pytest.mark.parametrize("kappa", [0.5, 1.0, 5.0, 50.0, 1e4])
def test_mean_cosine_closed_form_for_s2(kappa: float) -> None:
    assert vmf_mean_cosine(kappa, 3) == pytest.approx(1 / math.tanh(kappa) - 1 / kappa, rel=1e-9)


def test_mean_cosine_matches_bessel_ratio_on_the_circle() -> None:
    assert vmf_mean_cosine(2.0, 2) == pytest.approx(iv(1, 2.0) / iv(0, 2.0), rel=1e-12)


@pytest.mark.parametrize(
    ("dim", "kappa"), [(3, 0.5), (3, 2.0), (3, 10.0), (3, 200.0), (2, 3.0), (5, 4.0)]
)
def test_vmf_mean_cosine_matches_closed_form(dim: int, kappa: float) -> None:
    n = 40000
    mu = sample_uniform(n, dim, rng(1))
    x = sample_vmf(mu, kappa, rng(2))
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-12)
    cosines = (x * mu).sum(axis=1)
    tolerance = 5 * cosines.std() / math.sqrt(n)  # 5 standard errors
    assert abs(cosines.mean() - vmf_mean_cosine(kappa, dim)) < tolerance


def test_vmf_is_symmetric_about_its_mean_direction() -> None:
    """E[x] = A_d(kappa) mu: the tangent components average to zero."""
    mu = np.tile([[0.0, 0.6, 0.8]], (40000, 1))
    x = sample_vmf(mu, 3.0, rng(3))
    np.testing.assert_allclose(x.mean(axis=0), vmf_mean_cosine(3.0, 3) * mu[0], atol=0.01)


def test_vmf_with_zero_concentration_is_uniform() -> None:
    mu = sample_uniform(20000, 3, rng(4))
    assert abs((sample_vmf(mu, 0.0, rng(5)) * mu).sum(axis=1).mean()) < 0.02


def test_vmf_is_seeded() -> None:
    mu = sample_uniform(10, 3, rng(6))
    np.testing.assert_array_equal(sample_vmf(mu, 2.0, rng(7)), sample_vmf(mu, 2.0, rng(7)))


def test_restricted_sampling_keeps_the_fixed_coordinates() -> None:
    z = sample_uniform(5000, 4, rng(8))
    for n_fixed in (1, 2):
        z_pos = sample_restricted(z, 2.0, n_fixed, rng(9))
        np.testing.assert_array_equal(z_pos[:, :n_fixed], z[:, :n_fixed])
        np.testing.assert_allclose(np.linalg.norm(z_pos, axis=1), 1.0, atol=1e-12)
        assert np.abs(z_pos[:, n_fixed:] - z[:, n_fixed:]).max() > 0.1  # the rest moves


def test_restricted_free_part_is_vmf_on_the_sub_sphere() -> None:
    """On S^2 with z_1 fixed, the free direction is vMF on the circle: mean cosine I_1/I_0."""
    z = sample_uniform(40000, 3, rng(10))
    z_pos = sample_restricted(z, 2.0, 1, rng(11))
    free, free_pos = z[:, 1:], z_pos[:, 1:]
    np.testing.assert_allclose(
        np.linalg.norm(free_pos, axis=1), np.linalg.norm(free, axis=1), atol=1e-12
    )
    cosines = (free * free_pos).sum(axis=1) / (free * free).sum(axis=1)
    assert cosines.mean() == pytest.approx(iv(1, 2.0) / iv(0, 2.0), abs=0.01)


def test_restricted_sampling_needs_a_sub_sphere() -> None:
    z = sample_uniform(4, 3, rng())
    with pytest.raises(ValueError, match="n_fixed"):
        sample_restricted(z, 1.0, 2, rng())


def test_submanifold_negatives_share_the_fixed_coordinates() -> None:
    z = sample_uniform(50, 3, rng(12))
    negatives = sample_submanifold_uniform(z, 1, 64, rng(13))
    assert negatives.shape == (50, 64, 3)
    np.testing.assert_array_equal(negatives[:, :, 0], np.repeat(z[:, :1], 64, axis=1))
    np.testing.assert_allclose(np.linalg.norm(negatives, axis=2), 1.0, atol=1e-12)
    # uniform on each circle: the free direction averages to ~0 over many draws
    many = sample_submanifold_uniform(z[:1], 1, 20000, rng(14))[0, :, 1:]
    np.testing.assert_allclose(many.mean(axis=0), 0.0, atol=0.02)


def test_sample_positives_rejects_unknown_condition() -> None:
    with pytest.raises(ConfigError, match=r"full.*restricted"):
        sample_positives(sample_uniform(2, 3, rng()), "partial", 1.0, 1, rng())


def test_the_five_generators_are_registered() -> None:
    assert GENERATORS.names() == sorted(
        ["identity", "linear", "spiral", "patches", "invertible_mlp"]
    )


def min_separation_ratio(z: np.ndarray, x: np.ndarray) -> float:
    """min over pairs i < j of |x_i - x_j| / |z_i - z_j|: > 0 iff no two distinct z share an x."""
    upper = np.triu_indices(len(z), k=1)
    dz = np.linalg.norm(z[:, None] - z[None], axis=2)[upper]
    dx = np.linalg.norm(x[:, None] - x[None], axis=2)[upper]
    return float((dx / dz).min())


def apply(g, z: np.ndarray) -> np.ndarray:
    return g(torch.tensor(z, dtype=torch.float32)).double().numpy()


@pytest.mark.parametrize("name", ["identity", "linear", "spiral", "patches", "invertible_mlp"])
def test_generators_are_injective_on_samples(name: str) -> None:
    """Distinct latents stay apart: every generator has a Lipschitz inverse, so the separation
    ratio is bounded below (the bound 1e-2 is loose; a map that merges points gives ~0)."""
    g = generator(name)
    z = sample_uniform(600, 3, rng(15))
    x = apply(g, z)
    assert x.shape == (600, g.out_dim)
    assert min_separation_ratio(z, x) > 1e-2


@pytest.mark.parametrize("name", ["linear", "invertible_mlp"])
def test_the_injectivity_check_catches_a_fold(name: str) -> None:
    """g(z_1, z_2, |z_3|) merges each z with its mirror image: the ratio drops to ~0."""
    z = sample_uniform(300, 3, rng(16))
    z = np.concatenate([z, z * [1, 1, -1]])
    fold = np.concatenate([z[:, :2], np.abs(z[:, 2:])], axis=1)  # (z1, z2, |z3|)
    folded = apply(generator(name), fold)
    assert min_separation_ratio(z, folded) < 1e-6


@pytest.mark.parametrize("name", ["linear", "patches", "invertible_mlp"])
def test_generators_are_seeded(name: str) -> None:
    z = torch.tensor(sample_uniform(20, 3, rng()), dtype=torch.float32)
    torch.testing.assert_close(generator(name, 1)(z), generator(name, 1)(z))
    assert not torch.allclose(generator(name, 1)(z), generator(name, 2)(z))


def test_linear_generator_is_well_conditioned_full_rank() -> None:
    g = build_generator("linear", 3, 4, out_dim=12, max_condition=5.0)
    singular = torch.linalg.svdvals(g.matrix.double())
    assert len(singular) == 3 and singular.min() > 0
    assert singular.max() / singular.min() <= 5.0 + 1e-6
    with pytest.raises(ConfigError, match="out_dim"):
        build_generator("linear", 3, 0, out_dim=2)


def test_spiral_keeps_the_axis_coordinate_and_the_norm() -> None:
    z = torch.tensor(sample_uniform(100, 3, rng(16)), dtype=torch.float32)
    x = generator("spiral")(z)
    torch.testing.assert_close(x[:, 2], z[:, 2])
    torch.testing.assert_close(x.norm(dim=1), torch.ones(100))
    # the rotation angle of the (z1, z2) plane is pi * z3
    angle = torch.atan2(x[:, 1], x[:, 0]) - torch.atan2(z[:, 1], z[:, 0])
    torch.testing.assert_close(
        torch.remainder(angle - math.pi * z[:, 2] + math.pi, 2 * math.pi) - math.pi,
        torch.zeros(100),
        atol=1e-4,
        rtol=0,
    )


def test_patches_rotate_each_slice_by_its_angle_then_rotate() -> None:
    g = build_generator("patches", 3, 5, n_slices=4)
    z = torch.tensor([[0.6, 0.0, -0.8], [0.0, 0.6, 0.8], [0.8, 0.0, 0.6]])  # slices 0, 3, 3
    inner = g(z) @ g.rotation  # undo the fixed rotation R
    torch.testing.assert_close(inner[:, 2], z[:, 2])
    expected_angles = g.angles[[0, 3, 3]]
    angles = torch.atan2(inner[:, 1], inner[:, 0]) - torch.atan2(z[:, 1], z[:, 0])
    torch.testing.assert_close(torch.cos(angles), torch.cos(expected_angles), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.sin(angles), torch.sin(expected_angles), atol=1e-5, rtol=0)
    assert torch.det(g.rotation.double()) == pytest.approx(1.0, abs=1e-6)


def test_haar_rotation_is_a_rotation() -> None:
    q = haar_rotation(4, rng(17))
    np.testing.assert_allclose(q @ q.T, np.eye(4), atol=1e-12)
    assert np.linalg.det(q) == pytest.approx(1.0)


def test_invertible_mlp_layers_follow_the_pcl_construction() -> None:
    g = build_generator("invertible_mlp", 3, 6, n_layers=4, n_cond_samples=2000)
    threshold = condition_threshold(3, 0.25, 2000, np.random.default_rng([6, 17]))
    weights = g.weights.double()
    assert weights.shape == (4, 3, 3)
    torch.testing.assert_close(
        weights.norm(dim=1), torch.ones(4, 3, dtype=torch.float64), atol=1e-6, rtol=0
    )
    conds = torch.linalg.cond(weights)
    assert (conds <= threshold * (1 + 1e-5)).all()
