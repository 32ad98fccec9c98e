"""Encoders of the identifiability study: exact inverses with true parameters, MLP, seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from repdiag.contrastive.encoders import (
    INVERSE_ENCODERS,
    MLPEncoder,
    PatchesInverse,
    build_encoder,
)
from repdiag.data.sphere import build_generator, sample_uniform
from repdiag.errors import ConfigError

NAMES = ["identity", "linear", "spiral", "patches", "invertible_mlp"]
PARAMS = {"linear": {"out_dim": 8}, "invertible_mlp": {"n_cond_samples": 2000}}


def latents(n: int = 2000, seed: int = 0) -> torch.Tensor:
    return torch.tensor(sample_uniform(n, 3, np.random.default_rng(seed)), dtype=torch.float32)


def generator(name: str, seed: int = 3):
    return build_generator(name, 3, seed, **PARAMS.get(name, {}))


@pytest.mark.parametrize("name", NAMES)
def test_inverse_encoder_with_true_parameters_inverts_the_generator(name: str) -> None:
    g = generator(name)
    z = latents()
    f = INVERSE_ENCODERS.get(name).exact(g)
    torch.testing.assert_close(f(g(z)), z, atol=2e-5, rtol=0)
    f.normalize = False  # exact even without the projection onto the sphere
    torch.testing.assert_close(f(g(z)), z, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_random_inverse_encoders_are_not_the_inverse(name: str) -> None:
    g = generator(name)
    z = latents(200)
    f = build_encoder("inverse", g, seed=0)
    assert (f(g(z)) - z).abs().max() > 0.1
    assert sum(p.numel() for p in f.parameters() if p.requires_grad) > 0


def test_inverse_encoders_have_the_inverse_shape() -> None:
    assert isinstance(build_encoder("inverse", generator("linear"), seed=0).weight, nn.Parameter)
    assert build_encoder("inverse", generator("linear"), seed=0).weight.shape == (3, 8)
    mlp_inverse = build_encoder("inverse", generator("invertible_mlp"), seed=0)
    assert mlp_inverse.weights.shape == (3, 3, 3) and mlp_inverse.slope == 0.2
    spiral_inverse = build_encoder("inverse", generator("spiral"), seed=0)
    assert (
        spiral_inverse.angle_scale.shape == () and abs(spiral_inverse.angle_scale.item()) <= math.pi
    )


def test_inverse_leaky_relu_undoes_the_generator_activation() -> None:
    t = torch.linspace(-3, 3, 61)
    roundtrip = nn.functional.leaky_relu(nn.functional.leaky_relu(t, 0.2), 1 / 0.2)
    torch.testing.assert_close(roundtrip, t)


def test_soft_patches_inverse_approaches_the_hard_one() -> None:
    g = generator("patches")
    z = latents(4000)
    hard = PatchesInverse.exact(g)
    soft = PatchesInverse.exact(g, sharpness=1e5)
    errors = (soft(g(z)) - hard(g(z))).norm(dim=1)
    edge_distance = (z[:, 2:3] - g.edges[None]).abs().min(dim=1).values
    assert errors[edge_distance > 1e-3].max() < 1e-3  # away from the slice edges they agree
    weights = soft.slice_weights(torch.linspace(-1, 1, 101))
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(101))
    assert (weights >= 0).all()


def test_patches_sharpness_anneals_geometrically() -> None:
    f = build_encoder(
        "inverse",
        generator("patches"),
        seed=0,
        patches_sharpness=100.0,
        patches_sharpness_start=1.0,
    )
    assert f.sharpness == pytest.approx(1.0)
    f.set_progress(0.5)
    assert f.sharpness == pytest.approx(10.0)
    f.set_progress(1.0)
    assert f.sharpness == pytest.approx(100.0)
    hard = PatchesInverse.exact(generator("patches"))
    hard.set_progress(0.3)  # the hard inverse stays hard
    assert math.isinf(hard.sharpness)


def test_mlp_encoder_outputs_unit_vectors_and_is_seeded() -> None:
    g = generator("linear")
    f1 = build_encoder("mlp", g, seed=4, hidden=(16, 16))
    f2 = build_encoder("mlp", g, seed=4, hidden=(16, 16))
    assert isinstance(f1, MLPEncoder)
    x = g(latents(64))
    h = f1(x)
    assert h.shape == (64, 3)
    torch.testing.assert_close(h.norm(dim=1), torch.ones(64))
    torch.testing.assert_close(h, f2(x))
    linear_widths = [m.out_features for m in f1.modules() if isinstance(m, nn.Linear)]
    assert linear_widths == [16, 16, 3]


def test_unknown_encoder_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"mlp.*inverse"):
        build_encoder("transformer", generator("identity"), seed=0)
