"""Source torchvision (repdiag.encoders.sources.torchvision): builders without weights, weights
enums from the local torch.hub cache only, the architecture alone on the meta device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision

from repdiag.core.errors import EncoderError
from repdiag.encoders import build_encoder
from repdiag.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD
from tests.encoders.sources.helpers import random_images, shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def test_torchvision_builder_without_weights(images):
    enc = build_encoder(
        "tv",
        {
            "source": "torchvision",
            "id": "resnet18",
            "family": "supervised",
            "preprocess": {"input_size": 32},
        },
    )
    assert enc.layers == ["stage0", "stage1", "stage2", "stage3", "final", "head"]
    assert shapes(enc, images)["head"] == (3, 1000)
    assert enc.preprocess.interpolation == "bilinear" and enc.preprocess.mean == IMAGENET_MEAN


def test_torchvision_weights_enum_from_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    entry = {
        "source": "torchvision",
        "id": "resnet18",
        "family": "supervised",
        "pretrained": "IMAGENET1K_V1",
    }
    with pytest.raises(
        EncoderError,
        match=r"model 'tv': torchvision weights resnet18/IMAGENET1K_V1 are not in the torch.hub cache",
    ):
        build_encoder("tv", entry)
    reference = torchvision.models.resnet18(weights=None)
    (tmp_path / "checkpoints").mkdir()
    torch.save(reference.state_dict(), tmp_path / "checkpoints" / "resnet18-f37072fd.pth")
    enc = build_encoder("tv", entry)
    torch.testing.assert_close(enc.model.fc.weight, reference.fc.weight, rtol=0, atol=0)
    assert enc.preprocess.as_dict() == {
        "input_size": 224,
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
        "interpolation": "bilinear",
    }


def test_meta_mode_ignores_the_weights_enum(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))  # an empty cache
    entry = {"source": "torchvision", "id": "resnet18", "pretrained": "IMAGENET1K_V1"}
    encoder = build_encoder("tv", entry, meta=True)
    assert all(p.device.type == "meta" for p in encoder.model.parameters())
    assert encoder.origin == "torchvision resnet18" and encoder.layers[-1] == "head"
