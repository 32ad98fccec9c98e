"""The encoder factory (repdiag.encoders.factory.build_encoder): an entry's preprocess overrides
the source's, bad entries fail with one clear error naming the entry, every source builds on the
meta device without weights, entries are checked and completed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.core.errors import ConfigError, EncoderError
from repdiag.encoders import build_encoder
from repdiag.encoders.entries import check_models
from repdiag.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD
from repdiag.encoders.sources.hub import HUB_ARCHITECTURES
from tests.encoders.sources.helpers import random_images, shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def test_timm_cnn_stages_and_preprocess_override(images):
    entry = {
        "source": "timm",
        "id": "resnet18",
        "family": "supervised",
        "kwargs": {"num_classes": 0},
        "preprocess": {"input_size": 32},
    }
    enc = build_encoder("rn", entry)
    assert enc.layers == ["stage0", "stage1", "stage2", "stage3", "final"]
    assert shapes(enc, images) == {
        "stage0": (3, 64),
        "stage1": (3, 128),
        "stage2": (3, 256),
        "stage3": (3, 512),
        "final": (3, 512),
    }
    assert enc.preprocess.mean == IMAGENET_MEAN and enc.preprocess.std == IMAGENET_STD
    assert enc.preprocess.input_size == 32 and enc.preprocess.interpolation == "bicubic"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"source": "pip", "id": "x"}, r"model 'bad': models.bad.source: unknown source 'pip'"),
        (
            {"source": "timm", "id": "vit_tiny_patch16_22"},
            r"model 'bad': 'vit_tiny_patch16_22' is not a timm model; did you mean vit_tiny_patch16_224",
        ),
        (
            {"source": "open_clip", "id": "ViT-S-32", "pretrained": "laion9b"},
            r"model 'bad': 'laion9b' is not a pretrained tag of ViT-S-32",
        ),
        (
            {"source": "open_clip", "id": "ViT-Q-99"},
            r"model 'bad': 'ViT-Q-99' is not an open_clip model",
        ),
        (
            {"source": "torchvision", "id": "resnet18", "pretrained": "IMAGENET9K"},
            r"'IMAGENET9K' is not a weights name of resnet18",
        ),
        (
            {"source": "checkpoint", "id": "resnet18", "weights": "missing/model.safetensors"},
            r"model 'bad': weights file missing/model.safetensors does not exist",
        ),
        (
            {"source": "checkpoint", "id": "resnet18", "weights": "model.pt"},
            r"models.bad.weights: 'model.pt' is not a .safetensors file",
        ),
        (
            {"source": "python", "id": "tests.encoders.custom_encoders"},
            r"must be 'package.module:callable'",
        ),
        (
            {"source": "python", "id": "tests.encoders.nowhere:f"},
            r"model 'bad': cannot import 'tests.encoders.nowhere'",
        ),
        (
            {"source": "python", "id": "tests.encoders.custom_encoders:not_a_module"},
            r"returned int, not an nn.Module",
        ),
        (
            {"source": "timm", "id": "resnet18", "pretrained": "no/such/file.safetensors"},
            r"pretrained weights file no/such/file.safetensors does not exist",
        ),
        (
            {
                "source": "timm",
                "id": "vit_tiny_patch16_224",
                "kwargs": {"class_token": False, "global_pool": "avg"},
                "pooling": "cls",
            },
            r"model 'bad': timm model VisionTransformer has no class token.*set pooling: mean",
        ),
    ],
)
def test_bad_entries_fail_with_one_clear_error_naming_the_entry(entry, message):
    with pytest.raises(EncoderError, match=message):
        build_encoder("bad", {"family": "other", **entry})


def test_config_entries_are_built_on_meta_without_weights():
    entries = {
        "vit": {"source": "timm", "id": "vit_small_patch16_224.dino", "pretrained": True},
        "ckpt": {"source": "checkpoint", "id": "resnet18", "weights": "/nonexistent.safetensors"},
        "hub": {"source": "hub", "id": "dino_resnet50", "repo": "/nonexistent"},
    }
    for key, entry in entries.items():
        built = build_encoder(key, {**entry, "pooling": "cls"}, meta=True, config={})
        assert next(built.model.parameters()).device.type == "meta", key
    built = build_encoder("hub", {**entries["hub"], "pooling": "cls"}, meta=True, config={})
    assert built.layers == ["stage0", "stage1", "stage2", "stage3", "final"]  # no fc: no head
    assert built.origin == HUB_ARCHITECTURES["dino_resnet50"]


def test_check_models_resolves_pooling_and_names_bad_keys():
    config = {
        "embeddings": {"pooling": "mean"},
        "models": {
            "a": {"source": "timm", "id": "resnet18", "family": "supervised", "pooling": None},
            "b": {"source": "timm", "id": "resnet18", "family": "supervised", "pooling": "cls"},
            "z": {"source": "zoo", "id": "mae", "family": "masked_modeling", "pooling": None},
        },
    }
    check_models(config)
    assert [config["models"][k]["pooling"] for k in "abz"] == ["mean", "cls", None]
    bad = [
        (
            {"source": "timm", "id": "resnet_18"},
            r"models.m.id: 'resnet_18' is not a timm model; did you mean",
        ),
        (
            {"source": "timm", "id": "resnet18", "weights": "w.safetensors"},
            r"models.m.weights is only read by sources",
        ),
        (
            {"source": "hub", "id": "resnet50", "repo": "hub", "pretrained": True},
            r"models.m.pretrained: hub entry points",
        ),
        (
            {"source": "hub", "id": "resnet50"},
            r"models.m.repo: source hub needs a local torch.hub directory",
        ),
        (
            {"source": "checkpoint", "id": "resnet18"},
            r"models.m.weights: source checkpoint needs a .safetensors file",
        ),
        (
            {"source": "torchvision", "id": "resnet18", "pretrained": True},
            r"models.m.pretrained: torchvision takes a weights enum",
        ),
    ]
    for entry, message in bad:
        with pytest.raises(ConfigError, match=message):
            check_models({"models": {"m": {"family": "other", **entry}}})


def test_random_weights_are_the_same_network_in_every_build_of_a_key():
    """Each job builds its model anew: a random-weight model must be one network across jobs
    (its embeddings and its Jacobians), another key another draw; the caller's RNG untouched."""
    from repdiag.encoders.factory import init_seed

    entry = {"source": "timm", "id": "vit_tiny_patch16_224", "family": "other",
             "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1,
                        "num_heads": 2}}  # fmt: skip
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first = build_encoder("a", entry).model.state_dict()
    assert torch.equal(torch.rand(3), before)  # the build drew from its own generator state
    again = build_encoder("a", entry).model.state_dict()
    other = build_encoder("b", entry).model.state_dict()
    weight = "blocks.0.attn.qkv.weight"
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first[weight], other[weight])
    assert (
        init_seed("a")
        == int.from_bytes(__import__("hashlib").sha256(b"a").digest()[:8], "big") % 2**63
    )
