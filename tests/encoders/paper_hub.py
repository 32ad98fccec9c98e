"""Local torch.hub directories standing in for the upstream checkouts that ``config/paper.yaml``
names, and random weights files in the layout each entry declares.

Facts, not code: :data:`UPSTREAM_ENTRY_POINTS` lists the entry points of each upstream
``hubconf.py`` (all ``name(pretrained=True, **kwargs)``). The ``hubconf.py`` files written here
define the ones the paper uses, with those names and signatures, building the same architectures
(torchvision's ResNet-50; VICReg's own ``resnet`` module, whose ResNet pads the input by one pixel,
has no ``fc`` and returns the pooled features, ``widen=2`` for ResNet-50 x2), and refuse
``pretrained=True`` (which would download) as a check that the project's loader passes
``pretrained=False``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

# Entry points of the upstream hubconf.py files (facebookresearch/<repo>, branch main).
# VICReg: resnet50x2/resnet200x2 as its README and issue #9 name them (checkouts from before
# July 2022 call them resnet50w2/resnet200w2).
UPSTREAM_ENTRY_POINTS = {
    "facebookresearch_barlowtwins_main": ("resnet50",),
    "facebookresearch_vicreg_main": ("resnet50", "resnet50x2", "resnet200x2"),
    "facebookresearch_swav_main": ("resnet50", "resnet50w2", "resnet50w4", "resnet50w5"),
    "facebookresearch_dino_main": (
        "dino_vits16",
        "dino_vits8",
        "dino_vitb16",
        "dino_vitb8",
        "dino_resnet50",
        "dino_xcit_small_12_p16",
        "dino_xcit_small_12_p8",
        "dino_xcit_medium_24_p16",
        "dino_xcit_medium_24_p8",
    ),
}

_NO_DOWNLOAD = """

def _offline(pretrained):
    if pretrained:
        raise RuntimeError("pretrained=True would download and unpickle weights")
"""

TORCHVISION_RESNET50 = (
    """import torch
from torchvision.models.resnet import resnet50 as _resnet50

dependencies = ["torch", "torchvision"]
"""
    + _NO_DOWNLOAD
)

HUBCONF = {
    "facebookresearch_barlowtwins_main": TORCHVISION_RESNET50
    + """

def resnet50(pretrained=True, **kwargs):
    _offline(pretrained)
    return _resnet50(weights=None, **kwargs)
""",
    "facebookresearch_swav_main": TORCHVISION_RESNET50
    + '''

def resnet50(pretrained=True, **kwargs):
    """ResNet-50; its fc is random (the SwAV checkpoint has none)."""
    _offline(pretrained)
    return _resnet50(weights=None, **kwargs)
''',
    "facebookresearch_dino_main": TORCHVISION_RESNET50
    + """

def dino_resnet50(pretrained=True, **kwargs):
    _offline(pretrained)
    model = _resnet50(weights=None, **kwargs)
    model.fc = torch.nn.Identity()
    return model
""",
    "facebookresearch_vicreg_main": """import torch
import resnet

dependencies = ["torch", "torchvision"]
"""
    + _NO_DOWNLOAD
    + """

def resnet50(pretrained=True, **kwargs):
    _offline(pretrained)
    model, _ = resnet.resnet50(**kwargs)
    return model


def resnet50x2(pretrained=True, **kwargs):
    _offline(pretrained)
    model, _ = resnet.resnet50x2(**kwargs)
    return model


def resnet200x2(pretrained=True, **kwargs):
    _offline(pretrained)
    model, _ = resnet.resnet200x2(**kwargs)
    return model
""",
}

# VICReg's ResNet: a one-pixel zero pad, then conv1 (7x7, stride 2, padding 2), widths scaled by
# ``widen``, no fc; ``forward`` returns the flattened global average. Built from torchvision's
# Bottleneck, whose parameter names are those of VICReg's.
VICREG_RESNET = """import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, conv1x1


class ResNet(nn.Module):
    def __init__(self, layers, widen=1):
        super().__init__()
        width = 64 * widen
        self.padding = nn.ConstantPad2d(1, 0.0)
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.inplanes = width
        self.layer1 = self._make_layer(width, layers[0], 1)
        self.layer2 = self._make_layer(width * 2, layers[1], 2)
        self.layer3 = self._make_layer(width * 4, layers[2], 2)
        self.layer4 = self._make_layer(width * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))

    def _make_layer(self, planes, blocks, stride):
        out = planes * Bottleneck.expansion
        downsample = nn.Sequential(conv1x1(self.inplanes, out, stride), nn.BatchNorm2d(out))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = out
        layers += [Bottleneck(out, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.padding(x)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


def resnet50(**kwargs):
    return ResNet([3, 4, 6, 3], **kwargs), 2048


def resnet50x2(**kwargs):
    return ResNet([3, 4, 6, 3], widen=2, **kwargs), 4096


def resnet200x2(**kwargs):
    return ResNet([3, 24, 36, 3], widen=2, **kwargs), 4096
"""

SIBLINGS = {"facebookresearch_vicreg_main": {"resnet.py": VICREG_RESNET}}


def write_hub_dirs(root: Path) -> dict[str, Path]:
    """``{checkout name: directory}`` of every local hub directory, written under ``root``."""
    dirs = {}
    for name, hubconf in HUBCONF.items():
        repo = root / name
        repo.mkdir(parents=True)
        (repo / "hubconf.py").write_text(hubconf)
        for filename, text in SIBLINGS.get(name, {}).items():
            (repo / filename).write_text(text)
        dirs[name] = repo
    return dirs


CLASSIFIERS = ("fc", "head", "classifier")


def checkpoint_state(
    model: torch.nn.Module, entry: Mapping[str, Any], seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random weights of ``model`` in the layout ``entry`` declares.

    Every floating tensor is scaled by a random factor in [0.9, 1.1] (so that a loaded model
    differs from a fresh one, BatchNorm variances stay positive); ``state_dict_prefix`` is
    prepended to every key (SwAV's ``module.``); ``strict: false`` means a published file without
    the final classifier and with tensors the model does not use (SwAV's prototypes), so those are
    dropped and one is added.
    """
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().clone().contiguous()
        if tensor.is_floating_point():
            tensor = tensor * (0.9 + 0.2 * torch.rand(tensor.shape, generator=generator))
        state[name] = tensor
    if entry.get("strict", True) is False:
        state = {k: v for k, v in state.items() if k.split(".")[0] not in CLASSIFIERS}
        state["prototypes.weight"] = torch.randn(8, 4, generator=generator)
    prefix = entry.get("state_dict_prefix") or ""
    return {f"{prefix}{k}": v for k, v in state.items()}
