"""Source ``torchvision``: ``torchvision.models.get_model(id, **kwargs)``; ``pretrained`` a weights
enum name (its file must be in the torch.hub cache) or a local weights file.

In meta mode the architecture is built alone, random weights on the meta device, with the
preprocessing of no weights (``torchvision <id>``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from repdiag.encoders.entries import is_local_path, model_error
from repdiag.encoders.preprocess import from_torchvision
from repdiag.encoders.sources.base import SOURCES, BuildOptions, Built, close_names
from repdiag.encoders.weights import load_into, load_weights_file


def torchvision_cached(key: str, name: str, weights: Any) -> Path:
    """The torch.hub cache file of a torchvision weights enum, or an error saying where to put it."""
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name
    if not cached.is_file():
        raise model_error(
            key,
            f"torchvision weights {name}/{weights.name} are not in the torch.hub cache ({cached}) "
            f"and nothing is downloaded here: download {weights.url} to that path, or set "
            "pretrained to a local file",
        )
    return cached


@SOURCES.register("torchvision")
def build_torchvision(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    import torchvision

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    builders = torchvision.models.list_models()
    if name not in builders:
        raise model_error(
            key, f"{name!r} is not a torchvision model builder{close_names(name, builders)}"
        )
    pretrained = None if options.meta else entry.get("pretrained")
    weights, state = None, None
    if isinstance(pretrained, str) and is_local_path(pretrained):
        state = load_weights_file(pretrained, key)
    elif isinstance(pretrained, str) and pretrained:
        enum = torchvision.models.get_model_weights(name)
        if pretrained not in enum.__members__:
            raise model_error(
                key,
                f"{pretrained!r} is not a weights name of {name}; choose one of {list(enum.__members__)}",
            )
        weights = enum[pretrained]
        state = load_weights_file(torchvision_cached(key, name, weights), key)
        if "categories" in weights.meta:
            kwargs.setdefault("num_classes", len(weights.meta["categories"]))
        if name.startswith("vit_") and "min_size" in weights.meta:
            kwargs.setdefault("image_size", weights.meta["min_size"][0])
    try:
        with options.device():
            model = torchvision.models.get_model(name, weights=None, **kwargs)
    except Exception as err:
        raise model_error(
            key, f"torchvision could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    if state is not None:
        load_into(model, state, key, where=f"weights of {name}")
    return Built(model, from_torchvision(weights), origin=f"torchvision {name}")
