"""The CIFAR run grid from the config, its checks and one tiny run end to end (repdiag.cifar.study)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from repdiag.cifar.data import write_fixture
from repdiag.cifar.regimes import AUGMENTATION_GROUPS
from repdiag.cifar.study import (
    check_cifar_config,
    loader_workers,
    parse_run,
    run_names,
    run_params,
    run_simclr_probe,
)
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError


def _config(**cifar) -> dict:
    return fill_defaults({"cifar": cifar})


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
