"""Every source builds a real architecture offline, with its own preprocessing; bad entries fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file

from repdiag.core.errors import ConfigError, EncoderError
from repdiag.encoders import SOURCES, build_encoder
from repdiag.encoders.entries import check_models
from repdiag.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD

torch.set_num_threads(1)

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


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)


def shapes(encoder, images) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in encoder.layer_outputs(encoder.preprocess(images)).items()}


def test_registry_lists_every_source():
    assert SOURCES.names() == sorted(
        ["timm", "open_clip", "torchvision", "hub", "checkpoint", "zoo", "python"]
    )


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


HUBCONF = """
dependencies = ["torch"]
import torch
from torch import nn
from tinynet import TinyResNet  # a sibling module, imported like torch.hub does


def tiny_resnet(pretrained=True, width=4):
    if pretrained:
        raise RuntimeError("this entry point would download and unpickle weights")
    return TinyResNet(width)
"""

TINYNET = """
import torch
from torch import nn


class TinyResNet(nn.Module):
    def __init__(self, width):
        super().__init__()
        conv = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, stride=2, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.layer1, self.layer2 = conv(3, width), conv(width, 2 * width)
        self.layer3, self.layer4 = conv(2 * width, 2 * width), conv(2 * width, 4 * width)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, 5)

    def forward(self, x):
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
"""


def test_hub_entry_point_from_a_local_directory_with_prefixed_weights(tmp_path, images):
    repo = tmp_path / "hub"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF)
    (repo / "tinynet.py").write_text(TINYNET)
    entry = {
        "source": "hub",
        "id": "tiny_resnet",
        "repo": str(repo),
        "family": "variance_decorrelation",
        "kwargs": {"width": 4},
        "preprocess": {"input_size": 32},
    }
    random_init = build_encoder("bt", entry)
    assert random_init.layers == ["stage0", "stage1", "stage2", "stage3", "final", "head"]
    assert shapes(random_init, images)["stage3"] == (3, 16)
    # published checkpoints carry a "module." prefix and extra heads (SwAV's prototypes), no fc
    state = {
        f"module.{k}": v + 1.0 if v.is_floating_point() else v
        for k, v in random_init.model.state_dict().items()
    }
    del state["module.fc.weight"], state["module.fc.bias"]
    state["module.prototypes.weight"] = torch.zeros(3, 16)
    torch.save(state, tmp_path / "weights.pth")
    entry = {
        **entry,
        "weights": str(tmp_path / "weights.pth"),
        "state_dict_prefix": "module.",
        "strict": False,
    }
    loaded = build_encoder("bt", entry)
    torch.testing.assert_close(
        loaded.model.layer1[0].weight, random_init.model.layer1[0].weight + 1.0
    )
    assert loaded.layers == [
        "stage0",
        "stage1",
        "stage2",
        "stage3",
        "final",
    ]  # the random fc is gone
    with pytest.raises(
        EncoderError,
        match=r"model 'bt': .* lack 2 weights of the model, e.g. \['fc.bias', 'fc.weight'\]",
    ):
        build_encoder("bt", {**entry, "strict": True})
    state["module.fc.weight"], state["module.fc.bias"] = torch.zeros(5, 16), torch.zeros(5)
    torch.save(state, tmp_path / "weights.pth")
    with pytest.raises(
        EncoderError, match=r"model 'bt': .*1 weights the model does not have.*prototypes.weight"
    ):
        build_encoder("bt", {**entry, "strict": True})
    with pytest.raises(
        EncoderError, match=r"model 'bt': .*no entry point 'nope'; it has .*'tiny_resnet'\]"
    ):
        build_encoder("bt", {**entry, "id": "nope"})
    with pytest.raises(EncoderError, match=r"model 'bt': .* is not a torch.hub directory"):
        build_encoder("bt", {**entry, "repo": str(tmp_path)})


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


def test_python_encoder_gives_exactly_what_its_module_computes(images):
    from tests.encoders.custom_encoders import TokenNet

    entry = {
        "source": "python",
        "id": "tests.encoders.custom_encoders:token_net",
        "family": "other",
        "kwargs": {"depth": 2},
    }
    enc = build_encoder("mine", entry)
    assert enc.layers == ["block00", "block01", "final"]
    assert enc.preprocess.as_dict() == {**TokenNet.preprocess_cfg}
    x = enc.preprocess(images)
    assert x.shape == (3, 3, 16, 16)
    reference = TokenNet(depth=2).eval()
    out = enc.layer_outputs(x)
    torch.testing.assert_close(out["final"], reference(x), rtol=0, atol=0)
    for i, tokens in enumerate(reference.tokens(x)):
        torch.testing.assert_close(out[f"block0{i}"], tokens[:, 0], rtol=0, atol=0)
    vit = build_encoder(
        "v",
        {"source": "python", "id": "tests.encoders.custom_encoders:small_vit", "family": "other"},
    )
    assert vit.layers == ["block00", "block01", "final", "head"] and vit.preprocess.input_size == 32


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


def test_timm_pretrained_without_a_local_cache_fails_before_any_download(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    monkeypatch.setattr("repdiag.encoders.registry._hf_cached", lambda repo, files: None)
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


def test_pickle_checkpoints_are_refused_without_unpickling(tmp_path):
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, path)  # a torch.save zip archive under a safetensors name
    entry = {"source": "checkpoint", "id": "resnet18", "family": "other", "weights": str(path)}
    with pytest.raises(
        EncoderError,
        match=r"model 'pk': .*model.safetensors is a pickle \(torch.save\) file; it is refused",
    ):
        build_encoder("pk", entry)
    path.write_bytes(b"\x80\x04\x95" + b"\x00" * 40)  # a raw pickle (protocol 4)
    with pytest.raises(EncoderError, match="is a pickle"):
        build_encoder("pk", entry)
    path.write_bytes((10**6).to_bytes(8, "little") + b'{"w": ')  # header longer than the file
    with pytest.raises(
        EncoderError, match=r"model 'pk': .* is not a valid safetensors file \(truncated"
    ):
        build_encoder("pk", entry)


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
