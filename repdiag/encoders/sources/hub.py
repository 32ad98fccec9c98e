"""Source ``hub``: entry point ``id`` of the ``hubconf.py`` in the local directory ``repo`` (what
``torch.hub.load(repo, id, source="local")`` runs), built with ``pretrained=False``; weights from
``weights``.

In meta mode the entry point builds the architecture on the meta device and no weights are read
(``hub <repo>:<id> (local checkout)``); without the checkout, the entry points whose architecture
is known (:data:`HUB_ARCHITECTURES`) are built from library code."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repdiag.encoders.entries import model_error
from repdiag.encoders.preprocess import from_torchvision
from repdiag.encoders.sources.base import SOURCES, BuildOptions, Built, call_module_builder
from repdiag.encoders.weights import load_entry_weights, load_weights_file

log = logging.getLogger(__name__)

# torch.hub entry points whose architecture is known without the local checkout (its hubconf.py),
# from the hubconf.py of facebookresearch/barlowtwins, swav, dino and vicreg: torchvision's
# resnet50 (the Barlow Twins and SwAV checkpoints have no fc, so ``strict: false`` removes it;
# DINO sets fc = Identity; VICReg's own ResNet-50 has none and pads 1 + 2 where torchvision pads
# 3: the same convolutions), and VICReg's ResNet-50 x2, every width doubled (``widen=2``).
HUB_ARCHITECTURES: dict[str, str] = {
    "resnet50": "torchvision resnet50 without fc",
    "dino_resnet50": "torchvision resnet50 without fc",
    "resnet50w2": "ResNet-50 with every width doubled (VICReg widen=2), no fc",
    "resnet50x2": "ResNet-50 with every width doubled (VICReg widen=2), no fc; "
    "facebookresearch/vicreg's hubconf.py calls it resnet50w2",
}


@contextlib.contextmanager
def _on_sys_path(directory: Path):
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(directory))


def _hub_entry_point(key: str, repo: Path, name: str) -> Callable[..., Any]:
    """Import ``repo/hubconf.py`` (as ``torch.hub.load(source="local")`` does) and get ``name``."""
    hubconf = repo / "hubconf.py"
    if not hubconf.is_file():
        raise model_error(
            key,
            f"{repo} is not a torch.hub directory (no hubconf.py); set repo to a local hub checkout",
        )
    module_name = "repdiag_hubconf_" + hashlib.sha1(str(repo.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, hubconf)
    module = importlib.util.module_from_spec(spec)
    with _on_sys_path(repo):
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise model_error(
                key, f"importing {hubconf} failed ({type(err).__name__}: {err})"
            ) from err
    entry_point = getattr(module, name, None)
    if not callable(entry_point) or name.startswith("_"):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise model_error(key, f"{hubconf} has no entry point {name!r}; it has {sorted(names)}")
    return entry_point


@SOURCES.register("hub")
def build_hub(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    repo, name = Path(str(entry["repo"])).expanduser(), str(entry["id"])
    if options.meta and not (repo / "hubconf.py").is_file():
        with options.device():
            model = _known_architecture(key, entry)
        return Built(model, from_torchvision(None), origin=HUB_ARCHITECTURES[name])
    kwargs = dict(entry.get("kwargs") or {})
    with options.device():
        model = _from_entry_point(key, repo, name, kwargs)
    origin = f"hub {repo.name}:{name}" + (" (local checkout)" if options.meta else "")
    if options.meta:
        return Built(model, from_torchvision(None), origin=origin)
    if entry.get("weights"):
        state = load_weights_file(entry["weights"], key)
        load_entry_weights(model, state, key, entry)
    else:
        log.warning("model %s: hub entry without weights: random initialisation", key)
    return Built(model, from_torchvision(None), origin=origin)


def _from_entry_point(key: str, repo: Path, name: str, kwargs: dict[str, Any]) -> nn.Module:
    entry_point = _hub_entry_point(key, repo, name)
    if "pretrained" in inspect.signature(entry_point).parameters:
        kwargs["pretrained"] = False  # the entry point's own loader would download and unpickle
    with _on_sys_path(repo):
        return call_module_builder(
            key, entry_point, kwargs, f"hub entry point {name}({kwargs})", f"hub entry point {name}"
        )


def _known_architecture(key: str, entry: Mapping[str, Any]) -> nn.Module:
    """The architecture of a known entry point (:data:`HUB_ARCHITECTURES`), random weights."""
    name = str(entry["id"])
    if name not in HUB_ARCHITECTURES:
        raise model_error(
            key,
            f"hub entry point {name!r} needs its local checkout {entry.get('repo')} "
            "(hubconf.py), which is absent, and its architecture is not known without it "
            f"(known: {sorted(HUB_ARCHITECTURES)})",
        )
    if name in ("resnet50w2", "resnet50x2"):
        return _WideResNet50()
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    model.fc = nn.Identity()
    return model


class _WideResNet50(nn.Module):
    """VICReg's ResNet-50 x2 (facebookresearch/vicreg resnet.py, ``widen=2``): timm's ResNet-50
    with channels 128/256/512/1024 and a 128-wide stem, run as torchvision/VICReg do (global
    average pooling after layer4, no fc), so it gets the same taps as the hub model."""

    def __init__(self) -> None:
        super().__init__()
        import timm

        net = timm.create_model(
            "resnet50",
            pretrained=False,
            num_classes=0,
            channels=(128, 256, 512, 1024),
            stem_width=128,
        )
        self.conv1, self.bn1, self.act1, self.maxpool = net.conv1, net.bn1, net.act1, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            net.layer1,
            net.layer2,
            net.layer3,
            net.layer4,
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.avgpool(x).flatten(1)
