"""Contrastive training on sphere latents: recovery with diversity, seeding, support-corrected batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.core.errors import ConfigError
from repdiag.identifiability.encoders import build_latent_encoder
from repdiag.identifiability.metrics import identifiability_metrics
from repdiag.identifiability.sphere import build_generator, sample_uniform
from repdiag.identifiability.train import (
    _sample_anchors,
    contrastive_step_loss,
    encode_latents,
    train_contrastive,
)
from tests.identifiability.conftest import contrastive, latent_encoder

torch.set_num_threads(1)


def short_run(sampling: str, seed: int = 0, steps: int = 150) -> dict[str, float]:
    """The paper's encoder (default widths, per-view BatchNorm), tau 0.3, kappa 1/tau, constant
    Adam lr; a short schedule at batch 128 and lr 1e-3 (10x the paper's) to fit a unit test."""
    g = build_generator("identity", 3, seed)
    f = build_latent_encoder(latent_encoder(), g, seed=seed)
    assert f.separate_views
    settings = contrastive(
        steps=steps,
        batch_size=128,
        n_negatives=128,
        lr=1e-3,
        lr_schedule="constant",
        temperature=0.3,
        kappa=1 / 0.3,
        sampling=sampling,
    )
    result = train_contrastive(f, g, settings, seed=seed)
    assert len(result.curve) == steps // settings.log_every and result.curve[-1][0] == steps
    assert result.curve[-1][1] < result.curve[0][1]  # the loss went down
    z = sample_uniform(2000, 3, np.random.default_rng(99))
    return identifiability_metrics(encode_latents(f, g, z), z, 0.5, seed=0)


def test_paper_mlp_recovers_with_diversity_and_keeps_only_the_fixed_coordinate_without() -> None:
    full = short_run("full")
    assert full["r2"] > 0.95
    assert full["ape"] < 0.1
    # restricted support (z_1 fixed in positive pairs): the perturbed coordinates are lost
    restricted = short_run("restricted")
    assert restricted["r2_z2"] < 0.2 and restricted["r2_z3"] < 0.2
    assert restricted["r2"] < 0.4
    assert restricted["ape"] > 3 * full["ape"]


def test_small_mlp_variant_still_trains() -> None:
    g = build_generator("identity", 3, 0)
    f = build_latent_encoder(latent_encoder(hidden=(64, 64), variant="small"), g, seed=0)
    settings = contrastive(steps=200, batch_size=128, n_negatives=128, lr=3e-3)
    train_contrastive(f, g, settings, seed=0)
    z = sample_uniform(2000, 3, np.random.default_rng(99))
    assert identifiability_metrics(encode_latents(f, g, z), z, 0.5, seed=0)["r2"] > 0.9


def learning_rates(schedule: str, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The learning rate of every Adam step of a 4-step run."""
    g = build_generator("identity", 3, 0)
    f = build_latent_encoder(latent_encoder(hidden=(8,)), g, seed=0)
    settings = contrastive(steps=4, batch_size=8, n_negatives=8, lr=1e-2, lr_schedule=schedule)
    seen: list[float] = []
    original = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    train_contrastive(f, g, settings, seed=0)
    return seen


def test_constant_and_cosine_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """lr_k = lr (constant) or lr (1 + cos(pi k / steps)) / 2 (cosine) at step k = 0..steps-1."""
    np.testing.assert_allclose(learning_rates("constant", monkeypatch), [1e-2] * 4, rtol=1e-12)
    cosine = [1e-2 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(4)]
    np.testing.assert_allclose(learning_rates("cosine", monkeypatch), cosine, rtol=1e-12)


def test_training_is_seeded() -> None:
    def curve(seed: int) -> list[tuple[int, float]]:
        g = build_generator("linear", 3, seed, out_dim=5)
        f = build_latent_encoder(latent_encoder(hidden=(8,)), g, seed=seed)
        settings = contrastive(steps=6, batch_size=16, n_negatives=8, log_every=2)
        return train_contrastive(f, g, settings, seed=seed).curve

    assert curve(3) == curve(3)
    assert curve(3) != curve(4)


def test_support_corrected_groups_share_their_fixed_coordinates() -> None:
    settings = contrastive(
        loss="support_corrected",
        ratio=0.5,
        sampling="restricted",
        batch_size=12,
        group_size=4,
        n_fixed=1,
    )
    anchors, centres = _sample_anchors(settings, 3, np.random.default_rng(0))
    assert anchors.shape == (12, 3) and centres.shape == (3, 3)
    np.testing.assert_allclose(np.linalg.norm(anchors, axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(anchors[:, 0].reshape(3, 4), np.repeat(centres[:, :1], 4, axis=1))


def test_support_corrected_loss_is_finite_and_differentiable() -> None:
    g = build_generator("spiral", 3, 0)
    f = build_latent_encoder(latent_encoder(hidden=(8,)), g, seed=0)
    for ratio in (0.0, 0.5, 1.0):
        settings = contrastive(
            loss="support_corrected",
            ratio=ratio,
            sampling="restricted",
            batch_size=8,
            group_size=4,
            n_negatives=6,
        )
        loss = contrastive_step_loss(f, g, settings, np.random.default_rng(1), "cpu")
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in f.parameters())
        f.zero_grad()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "support_corrected", "sampling": "full"}, "restricted"),
        (
            {
                "loss": "support_corrected",
                "sampling": "restricted",
                "batch_size": 10,
                "group_size": 4,
            },
            "multiple",
        ),
        ({"loss": "infonce", "ratio": 0.5}, "support_corrected"),
        ({"loss": "triplet"}, "loss must be one of"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        (
            {"loss": "support_corrected", "sampling": "restricted", "ratio": 2.0, "group_size": 1},
            r"\[0, 1\]",
        ),
    ],
)
def test_invalid_settings_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        contrastive(**kwargs)
