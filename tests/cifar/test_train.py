"""SimCLR training on CIFAR: schedule, planned steps, NT-Xent and seeding (repdiag.cifar.train)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.cifar.data import synthetic_images
from repdiag.cifar.encoders import build_simclr_model
from repdiag.cifar.train import SimCLRSettings, lr_factor, planned_steps, train_simclr
from repdiag.cifar.views import to_chw_tensor, view_transform
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _config(**cifar) -> dict:
    return fill_defaults({"cifar": cifar})


def _train(seed: int, steps: int = 4) -> tuple[list, torch.Tensor]:
    images = to_chw_tensor(synthetic_images(4, 4, 32, seed=0).images)
    torch.manual_seed(seed)
    model = build_simclr_model("mlp", {"hidden": [32]}, 16, 16, 8, 32)
    view = view_transform("no_crop", _config()["cifar"]["augment"], 32, MEAN, STD)
    settings = SimCLRSettings.from_config(
        dict(epochs=steps, batch_size=8, lr=1e-2, warmup_epochs=0, log_every=1, amp=False)
    )
    result = train_simclr(model, images, view, settings, seed=seed)
    assert result.steps == len(result.curve) == 2 * steps and result.epochs == steps
    return result.curve, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine() -> None:
    assert [lr_factor(s, 10, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 10, 4) == 1.0
    assert lr_factor(7, 10, 4) == pytest.approx(0.5)  # halfway through the 6 decay steps
    assert lr_factor(9, 10, 4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 6)))
    assert lr_factor(0, 10, 0) == 1.0


def test_planned_steps_use_full_batches_and_the_cap() -> None:
    assert planned_steps(100, SimCLRSettings.from_config(dict(epochs=2, batch_size=32))) == (3, 6)
    assert planned_steps(
        100, SimCLRSettings.from_config(dict(epochs=2, batch_size=32, max_steps=4))
    ) == (3, 4)
    with pytest.raises(ConfigError, match="batch_size"):
        planned_steps(10, SimCLRSettings.from_config(dict(batch_size=32)))


def test_nt_xent_matches_its_closed_form() -> None:
    """Identical one-hot views: positive similarity 1, 2N - 2 negatives at 0."""
    n, tau = 4, 0.5
    z = torch.eye(8)[:n]
    expected = -1 / tau + math.log(math.exp(1 / tau) + 2 * n - 2)
    assert float(nt_xent_loss(z, z.clone(), tau)) == pytest.approx(expected, rel=1e-6)


def test_training_is_seeded() -> None:
    curve_a, weights_a = _train(0)
    curve_b, weights_b = _train(0)
    curve_c, _ = _train(1)
    assert curve_a == curve_b
    torch.testing.assert_close(weights_a, weights_b, rtol=0, atol=0)
    assert curve_a != curve_c
    assert all(np.isfinite(loss) for _, loss, _ in curve_a)
