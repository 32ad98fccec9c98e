"""Source hub (repdiag.encoders.sources.hub): an entry point of a local hubconf.py with prefixed
weights; on the meta device, the checkout's entry point without weights, else a known
architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.core.errors import EncoderError
from repdiag.encoders import build_encoder
from repdiag.encoders.sources import hub
from tests.encoders.sources.helpers import random_images, shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


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


def test_the_wide_hub_resnet_has_doubled_widths():
    model = hub._WideResNet50().to("meta")
    widths = [getattr(model, f"layer{i}")[-1].conv3.out_channels for i in range(1, 5)]
    assert widths == [512, 1024, 2048, 4096]  # VICReg's resnet50x2: embedding 4096


def test_meta_mode_runs_the_checkout_or_builds_a_known_architecture(tmp_path):
    repo = tmp_path / "hub"
    repo.mkdir()
    (repo / "hubconf.py").write_text(HUBCONF)
    (repo / "tinynet.py").write_text(TINYNET)
    entry = {"source": "hub", "id": "tiny_resnet", "repo": str(repo), "kwargs": {"width": 4}}
    entry["weights"] = str(tmp_path / "absent.pth")  # not read on meta
    encoder = build_encoder("bt", entry, meta=True)
    assert all(p.device.type == "meta" for p in encoder.model.parameters())
    assert encoder.origin == "hub hub:tiny_resnet (local checkout)"
    assert encoder.layers == ["stage0", "stage1", "stage2", "stage3", "final", "head"]
    wide = build_encoder(
        "w", {"source": "hub", "id": "resnet50x2", "repo": "/nonexistent"}, meta=True
    )
    assert wide.origin == hub.HUB_ARCHITECTURES["resnet50x2"]
    with pytest.raises(EncoderError, match=r"model 'odd': .*needs its local checkout /nonexistent"):
        build_encoder(
            "odd", {"source": "hub", "id": "something_else", "repo": "/nonexistent"}, meta=True
        )
