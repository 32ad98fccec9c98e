"""The CIFAR-10 SimCLR grid: runs from the config, what each run uses, and running one.

A run is one SimCLR training plus its linear probe: architecture x regime x seed, named
``resnet18__crop_only__s0`` (the Snakemake wildcard and file stem). No torch import at module
level: the workflow lists runs and checks the config without loading torch.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from repdiag.cifar.regimes import REGIMES, regime_settings
from repdiag.core.errors import ConfigError

log = logging.getLogger(__name__)

RUN_PATTERN = re.compile(r"^(?P<architecture>[a-z0-9_]+)__(?P<regime>[a-z_]+)__s(?P<seed>[0-9]+)$")
ARCHITECTURE_NAMES = ("resnet18", "vit", "mlp")  # == repdiag.cifar.encoders.ARCHITECTURES (tested)


@dataclasses.dataclass(frozen=True)
class Run:
    architecture: str
    regime: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.architecture}__{self.regime}__s{self.seed}"


def parse_run(name: str) -> Run:
    """Inverse of :attr:`Run.name`."""
    match = RUN_PATTERN.match(name)
    if not match:
        raise ConfigError(f"{name!r} is not a CIFAR run name (e.g. resnet18__all__s0)")
    return Run(match["architecture"], match["regime"], int(match["seed"]))


def runs(cifar: Mapping[str, Any]) -> list[Run]:
    """Every run of the grid (architecture-major), none when ``cifar.enabled`` is false."""
    if not cifar or not cifar.get("enabled", False):
        return []
    return [
        Run(architecture, regime, int(seed))
        for architecture in cifar["architectures"]
        for regime in cifar["regimes"]
        for seed in cifar["seeds"]
    ]


def run_names(cifar: Mapping[str, Any]) -> list[str]:
    return [run.name for run in runs(cifar)]


def _canonical(value: Any) -> Any:
    """Nested mappings with sorted keys: Snakemake compares params by ``repr``, so the order of
    keys in a config file must not look like a change."""
    if isinstance(value, Mapping):
        return {key: _canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return value


def run_params(cifar: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Exactly the config values run ``name`` uses, as plain values with sorted keys (the rule's
    ``params``)."""
    run = parse_run(name)
    encoder = dict(cifar["encoders"][run.architecture])
    lr = encoder.pop("lr", None)
    train = dict(cifar["train"])
    if lr is not None:
        train["lr"] = lr
    return _canonical(
        {
            "run": run.name,
            "architecture": run.architecture,
            "regime": run.regime,
            "seed": run.seed,
            "data": {key: cifar[key] for key in ("data_dir", "format", "n_train", "n_test")},
            "feature_dim": cifar["feature_dim"],
            "encoder": encoder,
            "head": dict(cifar["head"]),
            "augment": regime_settings(run.regime, cifar["augment"]),
            "normalize": dict(cifar["normalize"]),
            "train": train,
            "probe": dict(cifar["probe"]),
        }
    )


def loader_workers(threads: int) -> int:
    """DataLoader workers for a job given ``threads`` cores: one core stays with the training loop."""
    return max(0, int(threads) - 1)


def _check_range(key: str, pair: list[float], low: float, high: float) -> None:
    if not low <= pair[0] <= pair[1] <= high:
        raise ConfigError(
            f"cifar.augment.{key} = {pair} must be [min, max] with {low} <= min <= max <= {high}"
        )


def check_cifar_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``cifar`` (registered in ``repdiag.cifar.config_checks()``).

    When the study is enabled the data directory must hold CIFAR-10 in one of the two layouts
    (the error says where to put it and how to get it).
    """
    cifar = config.get("cifar")
    if not cifar:
        return
    for name in cifar["regimes"]:
        if name not in REGIMES:
            raise ConfigError(
                f"cifar.regimes: unknown regime {name!r}; choose from {', '.join(REGIMES)}"
            )
    for name in cifar["architectures"]:
        if name not in ARCHITECTURE_NAMES:
            raise ConfigError(
                f"cifar.architectures: unknown architecture {name!r}; choose from "
                f"{', '.join(ARCHITECTURE_NAMES)}"
            )
    augment = cifar["augment"]
    _check_range("crop_scale", augment["crop_scale"], 1e-9, 1.0)
    _check_range("crop_ratio", augment["crop_ratio"], 1e-9, float("inf"))
    _check_range("blur_sigma", augment["blur_sigma"], 1e-9, float("inf"))
    if augment["blur_kernel"] % 2 == 0:
        raise ConfigError(f"cifar.augment.blur_kernel = {augment['blur_kernel']} must be odd")
    vit = cifar["encoders"]["vit"]
    if vit["embed_dim"] % vit["num_heads"]:
        raise ConfigError(
            f"cifar.encoders.vit.embed_dim = {vit['embed_dim']} must be a multiple of "
            f"cifar.encoders.vit.num_heads = {vit['num_heads']}"
        )
    if not cifar["enabled"]:
        return
    batch, n_train = cifar["train"]["batch_size"], cifar["n_train"]
    if n_train is not None and n_train < batch:
        raise ConfigError(
            f"cifar.n_train = {n_train} is smaller than cifar.train.batch_size = {batch}: "
            "no full batch to train on"
        )
    from repdiag.cifar.data import locate

    locate(cifar["data_dir"], cifar["format"])


def run_simclr_probe(
    params: Mapping[str, Any], device: str = "cpu", workers: int = 0
) -> tuple[dict[str, Any], list[tuple[int, float, float]]]:
    """Train one SimCLR run and probe it: (JSON record, loss curve rows (step, loss, lr))."""
    import torch

    from repdiag.cifar.data import load_cifar10
    from repdiag.cifar.encoders import build_simclr_model, parameter_count
    from repdiag.cifar.train import SimCLRSettings, train_simclr
    from repdiag.cifar.views import to_chw_tensor, view_transform

    start = time.monotonic()
    seed = int(params["seed"])
    data_params = params["data"]
    data = load_cifar10(
        data_params["data_dir"],
        layout=data_params["format"],
        n_train=data_params["n_train"],
        n_test=data_params["n_test"],
    )
    images = {"train": to_chw_tensor(data.train.images), "test": to_chw_tensor(data.test.images)}
    torch.manual_seed(seed)
    model = build_simclr_model(
        params["architecture"],
        params["encoder"],
        params["feature_dim"],
        params["head"]["hidden_dim"],
        params["head"]["out_dim"],
        data.image_size,
    )
    log.info(
        "%s: %s (%d parameters, head %d) on %s, %d loader workers",
        params["run"],
        params["architecture"],
        parameter_count(model.encoder),
        parameter_count(model.head),
        device,
        workers,
    )
    mean, std = params["normalize"]["mean"], params["normalize"]["std"]
    view = view_transform(params["regime"], params["augment"], data.image_size, mean, std)
    settings = SimCLRSettings.from_config(params["train"])
    trained = train_simclr(
        model, images["train"], view, settings, seed=seed, device=device, workers=workers
    )
    probe, feature_dim, feature_wall = _probe(params, model, images, data, device)
    log.info(
        "%s: probe accuracy %.4f (train %.4f, chance %.3f), final loss %.4f",
        params["run"],
        probe.accuracy,
        probe.train_accuracy,
        probe.chance,
        trained.final_loss,
    )
    record = {
        "run": params["run"],
        "architecture": params["architecture"],
        "regime": params["regime"],
        "regime_label": REGIMES.get(params["regime"]).label,
        "seed": seed,
        "accuracy": probe.accuracy,
        "data": _data_record(data),
        "model": {
            "feature_dim": feature_dim,
            "encoder_parameters": parameter_count(model.encoder),
            "head_parameters": parameter_count(model.head),
        },
        "train": {
            **_train_record(trained),
            "device": str(device),
            "loader_workers": workers,
            "threads": torch.get_num_threads(),
        },
        "probe": {**probe.as_dict(), "feature_wall_time_s": feature_wall},
        "wall_time_s": time.monotonic() - start,
        "params": dict(params),
    }
    return record, trained.curve


def _data_record(data: Any) -> dict[str, Any]:
    """Where a run's images came from and how many."""
    return {
        "root": str(data.root),
        "layout": data.layout,
        "n_train": len(data.train),
        "n_test": len(data.test),
        "n_classes": len(data.classes),
        "image_size": data.image_size,
    }


def _probe(
    params: Mapping[str, Any], model: Any, images: Mapping[str, Any], data: Any, device: str
) -> tuple[Any, int, float]:
    """The linear probe on frozen features: (its result, feature width, feature wall time s)."""
    from repdiag.cifar.probe import LinearProbeSettings, linear_probe
    from repdiag.cifar.train import extract_features
    from repdiag.cifar.views import eval_transform

    settings = LinearProbeSettings.from_config(params["probe"])
    start = time.monotonic()
    mean, std = params["normalize"]["mean"], params["normalize"]["std"]
    features = {
        split: extract_features(
            model.encoder,
            images[split],
            eval_transform(mean, std),
            device=device,
            batch_size=settings.batch_size,
        )
        for split in ("train", "test")
    }
    feature_wall = time.monotonic() - start
    probe = linear_probe(
        features["train"],
        data.train.labels,
        features["test"],
        data.test.labels,
        settings,
    )
    return probe, int(features["train"].shape[1]), feature_wall


def _train_record(trained: Any) -> dict[str, Any]:
    """The training half of a run's record: steps, losses and speed."""
    return {
        "steps": trained.steps,
        "epochs": trained.epochs,
        "initial_loss": trained.initial_loss,
        "final_loss": trained.final_loss,
        "wall_time_s": trained.wall_time_s,
        "steps_per_s": trained.steps_per_s,
        "images_per_s": trained.images_per_s,
    }
