"""SimCLR training (schedule, seeding, NT-Xent) and the run grid built from the config."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from repdiag.cifar.data import synthetic_images, write_fixture
from repdiag.cifar.encoders import build_simclr_model
from repdiag.cifar.regimes import AUGMENTATION_GROUPS
from repdiag.cifar.study import (
    check_cifar_config,
    loader_workers,
    parse_run,
    run_names,
    run_params,
    run_simclr_probe,
)
from repdiag.cifar.train import TrainSettings, lr_factor, planned_steps, train_simclr
from repdiag.cifar.views import to_chw_tensor, view_transform
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _config(**cifar) -> dict:
    return fill_defaults({"cifar": cifar})


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine() -> None:
    assert [lr_factor(s, 10, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 10, 4) == 1.0
    assert lr_factor(7, 10, 4) == pytest.approx(0.5)  # halfway through the 6 decay steps
    assert lr_factor(9, 10, 4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 6)))
    assert lr_factor(0, 10, 0) == 1.0


def test_planned_steps_use_full_batches_and_the_cap() -> None:
    assert planned_steps(100, TrainSettings(epochs=2, batch_size=32)) == (3, 6)
    assert planned_steps(100, TrainSettings(epochs=2, batch_size=32, max_steps=4)) == (3, 4)
    with pytest.raises(ConfigError, match="batch_size"):
        planned_steps(10, TrainSettings(batch_size=32))


def test_nt_xent_matches_its_closed_form() -> None:
    """Identical one-hot views: positive similarity 1, 2N - 2 negatives at 0."""
    n, tau = 4, 0.5
    z = torch.eye(8)[:n]
    expected = -1 / tau + math.log(math.exp(1 / tau) + 2 * n - 2)
    assert float(nt_xent_loss(z, z.clone(), tau)) == pytest.approx(expected, rel=1e-6)


def _train(seed: int, steps: int = 4) -> tuple[list, torch.Tensor]:
    images = to_chw_tensor(synthetic_images(4, 4, 32, seed=0).images)
    torch.manual_seed(seed)
    model = build_simclr_model("mlp", {"hidden": [32]}, 16, 16, 8, 32)
    view = view_transform("no_crop", _config()["cifar"]["augment"], 32, MEAN, STD)
    settings = TrainSettings(
        epochs=steps, batch_size=8, lr=1e-2, warmup_epochs=0, log_every=1, amp=False
    )
    result = train_simclr(model, images, view, settings, seed=seed)
    assert result.steps == len(result.curve) == 2 * steps and result.epochs == steps
    return result.curve, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_training_is_seeded() -> None:
    curve_a, weights_a = _train(0)
    curve_b, weights_b = _train(0)
    curve_c, _ = _train(1)
    assert curve_a == curve_b
    torch.testing.assert_close(weights_a, weights_b, rtol=0, atol=0)
    assert curve_a != curve_c
    assert all(np.isfinite(loss) for _, loss, _ in curve_a)


def test_runs_and_their_params() -> None:
    assert run_names(_config()["cifar"]) == []  # disabled by default
    cifar = _config(
        enabled=True, seeds=[0, 3], encoders={"vit": {"lr": 0.0005}}, train={"lr": 0.002}
    )["cifar"]
    names = run_names(cifar)
    assert len(names) == 3 * 3 * 2 and names[0] == "resnet18__all__s0"
    assert parse_run("vit__no_crop__s3").seed == 3
    with pytest.raises(ConfigError, match="run name"):
        parse_run("vit-all-0")
    vit = run_params(cifar, "vit__crop_only__s3")
    assert list(vit) == sorted(vit) and list(vit["train"]) == sorted(vit["train"])  # canonical
    assert vit["train"]["lr"] == 0.0005 and "lr" not in vit["encoder"]
    assert set(vit["augment"]) == set(AUGMENTATION_GROUPS["geometric"])
    mlp = run_params(cifar, "mlp__no_crop__s0")
    assert mlp["train"]["lr"] == 0.002 and mlp["encoder"] == {"hidden": [2048, 2048]}
    assert set(mlp["augment"]) == set(AUGMENTATION_GROUPS["photometric"])
    assert loader_workers(1) == 0 and loader_workers(8) == 7


def test_config_checks(tmp_path: Path) -> None:
    check_cifar_config(_config())  # disabled: no data needed
    with pytest.raises(ConfigError, match="CIFAR-10 was not found"):
        check_cifar_config(_config(enabled=True, data_dir=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match=r"cifar\.data_dir is not set"):
        check_cifar_config(_config(enabled=True))
    write_fixture(tmp_path, n_train_per_class=1, n_test_per_class=1)
    check_cifar_config(_config(enabled=True, data_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"cifar\.n_train"):
        check_cifar_config(_config(enabled=True, data_dir=str(tmp_path), n_train=16))
    with pytest.raises(ConfigError, match="blur_kernel"):
        check_cifar_config(_config(augment={"blur_kernel": 4}))
    with pytest.raises(ConfigError, match="crop_scale"):
        check_cifar_config(_config(augment={"crop_scale": [0.9, 0.2]}))
    with pytest.raises(ConfigError, match="num_heads"):
        check_cifar_config(_config(encoders={"vit": {"embed_dim": 10, "num_heads": 4}}))


def test_one_run_trains_probes_and_records(tmp_path: Path) -> None:
    write_fixture(tmp_path, n_train_per_class=4, n_test_per_class=2)
    cifar = _config(
        enabled=True,
        data_dir=str(tmp_path),
        feature_dim=16,
        encoders={"mlp": {"hidden": [32]}},
        head={"hidden_dim": 16, "out_dim": 8},
        train={"epochs": 1, "batch_size": 16, "warmup_epochs": 0, "log_every": 1},
        probe={"max_iter": 100},
    )["cifar"]
    params = run_params(cifar, "mlp__all__s0")
    record, curve = run_simclr_probe(copy.deepcopy(params), "cpu", workers=0)
    assert record["params"] == params and record["regime_label"] == "All"
    assert record["train"]["steps"] == 40 // 16 == len(curve)
    assert record["data"] == {
        "root": str(tmp_path / "cifar-10-batches-py"),
        "layout": "pickle",
        "n_train": 40,
        "n_test": 20,
        "n_classes": 10,
        "image_size": 32,
    }
    assert record["model"]["feature_dim"] == 16
    assert 0.0 <= record["accuracy"] == record["probe"]["accuracy"] <= 1.0
    assert record["probe"]["chance"] == pytest.approx(0.1)
