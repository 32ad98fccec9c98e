"""Entries and images shared by the tests of the encoder sources and of the factory."""

from __future__ import annotations

import numpy as np

TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}
VIT = {
    "source": "timm",
    "id": "vit_tiny_patch16_224",
    "family": "supervised",
    "kwargs": {"img_size": 32, "depth": 3, "num_classes": 7},
}


def random_images() -> np.ndarray:
    """Three random uint8 images (3, 32, 32, 3)."""
    return np.random.default_rng(0).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)


def shapes(encoder, images) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in encoder.layer_outputs(encoder.preprocess(images)).items()}
