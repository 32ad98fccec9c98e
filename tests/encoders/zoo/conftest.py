"""Tiny zoo runs for the unit tests: 32 px scenes, a 2-block ViT of width 32, seconds per run."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from repdiag.core.config import fill_defaults
from repdiag.encoders.zoo.spec import FAMILIES, run_spec

TINY_VIT = {
    "timm_model": "vit_tiny_patch16_224",
    "timm_kwargs": {"patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0},
}
TINY_RESNET = {
    "timm_model": "resnet10t",
    "timm_kwargs": {"channels": [8, 16, 16, 32], "stem_width": 8},
}
TINY_HPARAMS = {
    "barlow_twins": {"projector_dims": [64, 64]},
    "vicreg": {"projector_dims": [64, 64]},
    "dino": {"out_dim": 64, "hidden_dim": 64, "bottleneck_dim": 16},
    "simclr": {"projector_dims": [64, 32]},
    "clip": {"embed_dim": 32, "text_width": 32, "text_depth": 1},
    "mae": {"decoder_dim": 32, "decoder_heads": 2},
    "simmim": {"mask_patch": 8},
}


def tiny_config(**run_overrides: Any) -> dict[str, Any]:
    """A config (defaults filled) with one tiny run per objective, plus ``supervised_resnet``."""
    runs = {name: {"steps": 4, "batch_size": 8, **run_overrides} for name in FAMILIES}
    for name in runs:  # the ViT for mae and for the tests written against it, else the ResNet
        runs[name]["backbone"] = "resnet" if name == "simmim" else "vit"
    runs["supervised_resnet"] = {
        "objective": "supervised",
        "backbone": "resnet",
        "steps": 4,
        "batch_size": 8,
    }
    config = {
        "datasets": {},
        "models": {
            name: {"source": "zoo", "id": name, "family": FAMILIES[name]} for name in FAMILIES
        },
        "zoo": {
            "image_size": 32,
            "scenes": {"grid": [2, 2], "min_objects": 1, "max_objects": 3},
            "backbones": {"vit": copy.deepcopy(TINY_VIT), "resnet": copy.deepcopy(TINY_RESNET)},
            "objectives": runs,
            "hparams": copy.deepcopy(TINY_HPARAMS),
        },
    }
    return fill_defaults(config)


@pytest.fixture
def tiny_spec():
    """``tiny_spec(run, **spec_overrides)`` -> the resolved spec of a tiny run."""

    def make(run: str, **overrides: Any) -> dict[str, Any]:
        spec = run_spec(tiny_config(), run)
        spec.update(overrides)
        return spec

    return make


@pytest.fixture(autouse=True)
def one_thread():
    """Training tests run on one thread: bitwise determinism and a fair share of the CPUs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
