"""Encoders of the identifiability study: exact inverses with true parameters, MLP, seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.identifiability.encoders import (
    INVERSE_ENCODERS,
    MLPEncoder,
    PaperMLPEncoder,
    PatchesInverse,
    build_latent_encoder,
)
from repdiag.identifiability.sphere import build_generator, sample_uniform
from repdiag.identifiability.train import encode_views
from tests.identifiability.conftest import latent_encoder

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
    f = build_latent_encoder(latent_encoder("inverse"), g, seed=0)
    assert (f(g(z)) - z).abs().max() > 0.1
    assert sum(p.numel() for p in f.parameters() if p.requires_grad) > 0


def test_inverse_encoders_have_the_inverse_shape() -> None:
    assert isinstance(
        build_latent_encoder(latent_encoder("inverse"), generator("linear"), seed=0).weight,
        nn.Parameter,
    )
    assert build_latent_encoder(
        latent_encoder("inverse"), generator("linear"), seed=0
    ).weight.shape == (3, 8)
    mlp_inverse = build_latent_encoder(
        latent_encoder("inverse"), generator("invertible_mlp"), seed=0
    )
    assert mlp_inverse.weights.shape == (3, 3, 3) and mlp_inverse.slope == 0.2
    spiral_inverse = build_latent_encoder(latent_encoder("inverse"), generator("spiral"), seed=0)
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
    f = build_latent_encoder(
        latent_encoder("inverse", patches_sharpness=100.0, patches_sharpness_start=1.0),
        generator("patches"),
        seed=0,
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
    f1 = build_latent_encoder(latent_encoder(hidden=(16, 16), variant="small"), g, seed=4)
    f2 = build_latent_encoder(latent_encoder(hidden=(16, 16), variant="small"), g, seed=4)
    assert isinstance(f1, MLPEncoder) and not f1.separate_views
    x = g(latents(64))
    h = f1(x)
    assert h.shape == (64, 3)
    torch.testing.assert_close(h.norm(dim=1), torch.ones(64))
    torch.testing.assert_close(h, f2(x))
    linear_widths = [m.out_features for m in f1.modules() if isinstance(m, nn.Linear)]
    assert linear_widths == [16, 16, 3]


def test_unknown_encoder_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"mlp.*inverse"):
        build_latent_encoder(latent_encoder(kind="transformer"), generator("identity"), seed=0)


def test_the_schemas_mlp_is_the_papers_with_its_widths_and_parameter_count() -> None:
    """Hidden 128-256-256-256-128, Linear -> ReLU -> BatchNorm1d(affine), Linear -> 3:
    sum (w_in + 1) w_out over the Linears + 2 w per BN = 200451 for in_dim 3 (201347 for 10)."""
    f = build_latent_encoder(latent_encoder(), generator("identity"), seed=0)
    assert isinstance(f, PaperMLPEncoder) and f.separate_views
    linears = [m for m in f.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (3, 128), (128, 256), (256, 256), (256, 256), (256, 128), (128, 3)
    ]  # fmt: skip
    kinds = [type(m).__name__ for m in f.net]
    assert kinds == ["Linear", "ReLU", "BatchNorm1d"] * 5 + ["Linear"]
    assert all(m.affine for m in f.net if isinstance(m, nn.BatchNorm1d))
    by_hand = (
        (3 + 1) * 128 + (128 + 1) * 256 + 2 * (256 + 1) * 256 + (256 + 1) * 128 + (128 + 1) * 3
    )
    by_hand += 2 * (128 + 256 + 256 + 256 + 128)
    assert by_hand == 200451
    assert sum(p.numel() for p in f.parameters()) == by_hand
    linear = build_latent_encoder(latent_encoder(), generator("linear"), seed=0)  # x in R^8 here
    assert sum(p.numel() for p in linear.parameters()) == by_hand + 5 * 128
    x = generator("identity")(latents(64))
    h = f(x)
    assert h.shape == (64, 3)
    torch.testing.assert_close(h.norm(dim=1), torch.ones(64))


def test_paper_mlp_batch_norm_statistics_are_per_view() -> None:
    """encode_views passes each view alone: outputs equal f(view) in training mode, differ from
    a joint pass, and the first BN's running mean is the momentum average of the view means."""
    g = generator("identity")
    f = build_latent_encoder(latent_encoder(hidden=(16, 8)), g, seed=1)
    f.train()
    a = g(latents(32, seed=1))
    b = g(latents(48, seed=2)) * 0.5 + 0.3  # a view with other statistics
    first, bn = f.net[0], f.net[2]
    with torch.no_grad():
        mean_a, mean_b = (torch.relu(first(v)).mean(0) for v in (a, b))
        views = encode_views(f, [a, b])
        m = bn.momentum  # running mean starts at 0: after a then b it is (1 - m) m mu_a + m mu_b
        expected = (1 - m) * m * mean_a + m * mean_b
        torch.testing.assert_close(bn.running_mean, expected, atol=1e-6, rtol=0)
        alone = [f(a), f(b)]
        joint = f(torch.cat([a, b]))
    torch.testing.assert_close(views[0], alone[0])
    torch.testing.assert_close(views[1], alone[1])
    assert (joint[:32] - views[0]).abs().max() > 1e-3


def test_unknown_mlp_variant_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="variant"):
        build_latent_encoder(latent_encoder(variant="huge"), generator("identity"), seed=0)


def test_the_patches_inverse_takes_the_schemas_sharpness_and_refuses_none() -> None:
    f = build_latent_encoder(latent_encoder("inverse"), generator("patches"), seed=0)
    assert f.sharpness == pytest.approx(2.0)  # patches_sharpness_start
    f.set_progress(1.0)
    assert f.sharpness == pytest.approx(300.0)  # patches_sharpness
    unset = latent_encoder("inverse", patches_sharpness=None)
    with pytest.raises(ConfigError, match=r"inverse\.patches_sharpness"):
        build_latent_encoder(unset, generator("patches"), seed=0)
