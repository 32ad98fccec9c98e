"""What a zoo run records about itself: ``meta.json`` (docs/contracts.md) and the steps it took."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from repdiag.core.version import __version__
from repdiag.encoders.zoo.backbones import feature_dim, pooling
from repdiag.encoders.zoo.heads import MLPHead


def steps_trained(spec: Mapping[str, Any]) -> int:
    """The steps this run takes: ``stop_at`` of the ``steps``-step schedule, else all of them."""
    stop_at = spec.get("stop_at")
    return spec["steps"] if stop_at is None else min(int(stop_at), spec["steps"])


def run_meta(
    spec: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    preprocess: Mapping[str, Any],
    backbone: nn.Module,
    head: MLPHead | None,
    losses: list[float],
    wall_time_s: float,
    device: torch.device | str,
) -> dict[str, Any]:
    """The meta.json of a run (docs/contracts.md, ``results/zoo/<objective>/``) plus provenance."""
    tail = max(1, len(losses) // 10)
    return {
        "objective": spec["objective"],
        "family": spec["family"],
        "run": spec["run"],
        "timm_model": spec["timm_model"],
        "timm_kwargs": dict(kwargs),
        "pooling": pooling(backbone),
        "feature_dim": feature_dim(backbone),
        "preprocess": dict(preprocess),
        "head": None if head is None else {**head.description, "input": "final"},
        "steps": spec["steps"],
        "steps_trained": steps_trained(spec),
        "batch_size": spec["batch_size"],
        "seed": spec["seed"],
        "final_loss": losses[-1],
        "final_loss_mean": float(np.mean(losses[-tail:])),
        "initial_loss": losses[0],
        "wall_time_s": round(wall_time_s, 3),
        "backbone": spec["backbone"],
        "lr": spec["lr"],
        "warmup_fraction": spec["warmup_fraction"],
        "weight_decay": spec["weight_decay"],
        "grad_clip": spec["grad_clip"],
        "hparams": dict(spec["hparams"]),
        "scenes": dict(spec["scenes"]),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "versions": {
            "repdiag": __version__,
            "torch": torch.__version__,
            "timm": _timm_version(),
        },
    }


def _timm_version() -> str:
    import timm

    return timm.__version__
