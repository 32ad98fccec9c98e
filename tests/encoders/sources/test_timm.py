"""Sources timm and checkpoint (repdiag.encoders.sources.timm): real architectures offline with
timm's preprocessing, weights from local files, a missing cache refused before any download, the
architecture alone on the meta device."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from repdiag.core.errors import EncoderError
from repdiag.encoders import build_encoder
from tests.encoders.sources.helpers import VIT, random_images, shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def test_timm_vit_blocks_final_head_and_its_own_preprocessing(images):
    enc = build_encoder("vit", VIT)
    assert enc.layers == ["block00", "block01", "block02", "final", "head"]
    assert shapes(enc, images) == {
        **{f"block0{i}": (3, 192) for i in range(3)},
        "final": (3, 192),
        "head": (3, 7),
    }
    # timm's data config of vit_tiny_patch16_224 (augreg): mean = std = 0.5, bicubic; size as built
    assert enc.preprocess.as_dict() == {
        "input_size": 32,
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "interpolation": "bicubic",
    }
    assert not enc.model.training and not any(p.requires_grad for p in enc.model.parameters())
    assert (enc.key, enc.source, enc.family, enc.pooling) == ("vit", "timm", "supervised", "cls")


def test_checkpoint_from_safetensors_reproduces_the_saved_model(tmp_path, images):
    torch.manual_seed(3)
    reference = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=0
    ).eval()
    save_file(reference.state_dict(), str(tmp_path / "vit.safetensors"))
    entry = {
        "source": "checkpoint",
        "id": "vit_tiny_patch16_224",
        "family": "other",
        "weights": str(tmp_path / "vit.safetensors"),
        "kwargs": {"img_size": 32, "depth": 2, "num_classes": 0},
    }
    enc = build_encoder("ck", entry)
    x = enc.preprocess(images)
    torch.testing.assert_close(
        enc.layer_outputs(x, ["final"])["final"], reference(x), rtol=0, atol=0
    )


def test_timm_pretrained_local_file(tmp_path, images):
    torch.manual_seed(4)
    reference = timm.create_model("resnet18", pretrained=False, num_classes=5).eval()
    save_file(reference.state_dict(), str(tmp_path / "rn.safetensors"))
    entry = {
        "source": "timm",
        "id": "resnet18",
        "family": "supervised",
        "pretrained": str(tmp_path / "rn.safetensors"),
        "kwargs": {"num_classes": 5},
        "preprocess": {"input_size": 32},
    }
    enc = build_encoder("rn", entry)
    x = enc.preprocess(images)
    torch.testing.assert_close(enc.layer_outputs(x, ["head"])["head"], reference(x), rtol=0, atol=0)


def test_timm_pretrained_without_a_local_cache_fails_before_any_download(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    monkeypatch.setattr("repdiag.encoders.sources.timm.hf_cached", lambda repo, files: None)
    with pytest.raises(
        EncoderError,
        match=r"model 'p': pretrained weights of timm model 'resnet18.a1_in1k' are not in the local",
    ):
        build_encoder(
            "p",
            {
                "source": "timm",
                "id": "resnet18.a1_in1k",
                "family": "supervised",
                "pretrained": True,
            },
        )


def test_meta_mode_builds_the_architecture_and_reads_no_weights():
    checkpoint = {"source": "checkpoint", "id": "resnet18", "weights": "/nonexistent.safetensors"}
    pretrained = {**VIT, "pretrained": True}  # not in any cache here
    for key, entry in {"ck": checkpoint, "vit": pretrained}.items():
        encoder = build_encoder(key, entry, meta=True)
        assert all(p.device.type == "meta" for p in encoder.model.parameters()), key
        assert encoder.origin == f"timm {entry['id']}"
    assert encoder.layers == build_encoder("vit", VIT).layers
