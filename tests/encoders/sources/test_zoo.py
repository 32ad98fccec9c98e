"""Source zoo (repdiag.encoders.sources.zoo): a zoo checkpoint rebuilds backbone, head, pooling and
preprocessing; on the meta device a run is built from its spec, without a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from repdiag.core.errors import EncoderError
from repdiag.encoders import build_encoder
from tests.encoders.sources.helpers import random_images
from tests.encoders.zoo.conftest import tiny_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def write_zoo_run(root: Path, head: bool = True) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """A zoo run in the format of docs/contracts.md, written independently of the zoo's writer."""
    from repdiag.encoders.zoo.heads import MLPHead

    torch.manual_seed(5)
    kwargs = {
        "img_size": 32,
        "patch_size": 8,
        "embed_dim": 32,
        "depth": 2,
        "num_heads": 2,
        "num_classes": 0,
    }
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs).eval()
    projection = MLPHead([32, 16, 8], norm=None, activation="relu").eval() if head else None
    tensors = dict(backbone.state_dict())
    if projection is not None:
        tensors.update({f"head.{k}": v for k, v in projection.state_dict().items()})
    root.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / "model.safetensors"))
    meta = {
        "objective": "simclr",
        "family": "contrastive",
        "timm_model": "vit_tiny_patch16_224",
        "timm_kwargs": kwargs,
        "pooling": "mean",
        "preprocess": {
            "input_size": 32,
            "mean": [0.4] * 3,
            "std": [0.2] * 3,
            "interpolation": "bilinear",
        },
        "head": projection.description if projection is not None else None,
        "steps": 1,
        "batch_size": 2,
        "seed": 0,
        "final_loss": 1.0,
        "wall_time_s": 0.1,
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return backbone, projection


def test_zoo_checkpoint_rebuilds_backbone_head_pooling_and_preprocess(tmp_path, images):
    backbone, projection = write_zoo_run(tmp_path / "zoo" / "simclr")
    enc = build_encoder(
        "simclr",
        {"source": "zoo", "id": "simclr", "family": "contrastive"},
        zoo_dir=tmp_path / "zoo",
    )
    assert enc.layers == ["block00", "block01", "final", "head"] and enc.pooling == "mean"
    assert enc.preprocess.as_dict() == {
        "input_size": 32,
        "mean": [0.4] * 3,
        "std": [0.2] * 3,
        "interpolation": "bilinear",
    }
    x = enc.preprocess(images)
    out = enc.layer_outputs(x)
    torch.testing.assert_close(out["final"], backbone(x), rtol=0, atol=0)
    torch.testing.assert_close(out["head"], projection(backbone(x)), rtol=0, atol=0)
    tokens = backbone.blocks[0](backbone.norm_pre(backbone._pos_embed(backbone.patch_embed(x))))
    torch.testing.assert_close(out["block00"], tokens[:, 1:].mean(1))  # mean of the patch tokens
    with pytest.raises(
        EncoderError, match=r"model 'absent': .*results.*does not exist: train it first"
    ):
        build_encoder(
            "absent",
            {"source": "zoo", "id": "absent", "family": "other"},
            zoo_dir="results/nowhere",
        )


def test_meta_mode_builds_a_run_from_its_spec_without_a_checkpoint(tmp_path):
    config = tiny_config()
    entry = config["models"]["mae"]
    encoder = build_encoder("mae", entry, zoo_dir=tmp_path, meta=True, config=config)
    assert all(p.device.type == "meta" for p in encoder.model.parameters())
    assert encoder.origin == "zoo run mae (from its spec)"
    assert encoder.layers == ["block00", "block01", "final"]
    with pytest.raises(EncoderError, match=r"zoo run 'nope' is not in zoo.objectives"):
        build_encoder("x", {**entry, "id": "nope"}, meta=True, config=config)
