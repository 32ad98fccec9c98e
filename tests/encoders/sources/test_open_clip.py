"""Source open_clip (repdiag.encoders.sources.open_clip): the image tower with its projection head
and open_clip's preprocessing; the tower alone on the meta device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders import build_encoder
from tests.encoders.sources.helpers import TINY_CLIP, random_images, shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def test_open_clip_image_tower_with_projection_head(images):
    enc = build_encoder(
        "clip",
        {"source": "open_clip", "id": "ViT-S-32", "family": "vision_language", "kwargs": TINY_CLIP},
    )
    assert enc.layers == ["block00", "block01", "final", "head"]
    assert shapes(enc, images) == {
        "block00": (3, 64),
        "block01": (3, 64),
        "final": (3, 64),
        "head": (3, 24),
    }
    assert enc.preprocess.input_size == 32 and enc.preprocess.mean == pytest.approx(
        (0.48145466, 0.4578275, 0.40821073)
    )
    x = enc.preprocess(images)
    torch.testing.assert_close(
        enc.layer_outputs(x, ["head"])["head"], enc.model(x)
    )  # head = visual(x)


def test_meta_mode_builds_the_tower_without_weights_or_tags():
    entry = {"source": "open_clip", "id": "ViT-S-32", "family": "vision_language"}
    entry |= {"kwargs": TINY_CLIP, "pretrained": "laion9b"}  # no such tag: never resolved
    encoder = build_encoder("clip", entry, meta=True)
    assert all(p.device.type == "meta" for p in encoder.model.parameters())
    assert encoder.layers == ["block00", "block01", "final", "head"]
    assert encoder.origin == "open_clip ViT-S-32" and encoder.preprocess.input_size == 32
