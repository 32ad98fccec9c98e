"""What every source builder shares: the :data:`SOURCES` registry, the options of a build
(:class:`BuildOptions`, the meta-device mode among them) and what a builder returns
(:class:`Built`)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repdiag.core.registry import Registry
from repdiag.encoders.entries import model_error
from repdiag.encoders.preprocess import Preprocess

META = torch.device("meta")


@dataclasses.dataclass
class Built:
    """What a source builder returns: the module, its own preprocessing, a pooling it imposes, and
    ``origin``: the architecture it was built as, in words (e.g. ``timm resnet50``)."""

    model: nn.Module
    preprocess: Preprocess
    pooling: str | None = None
    origin: str = ""


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How a builder builds: ``zoo_dir``, the folder of the zoo's runs; ``meta``, the architecture
    only, with random weights on the meta device (shapes, no data: nothing is read or downloaded,
    weights files, pretrained tags and checkpoints are ignored); ``config``, the whole config (in
    meta mode a zoo run is built from its spec there, not from its checkpoint)."""

    zoo_dir: Path
    meta: bool = False
    config: Mapping[str, Any] | None = None

    def device(self) -> contextlib.AbstractContextManager:
        """The meta device as the default device in meta mode, else no change."""
        return torch.device(META) if self.meta else contextlib.nullcontext()


Builder = Callable[[str, Mapping[str, Any], BuildOptions], Built]
SOURCES: Registry[Builder] = Registry("encoder source")


def close_names(name: str, names: Iterable[str]) -> str:
    """``; did you mean a, b?`` with the names close to ``name``, or nothing."""
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def call_module_builder(
    key: str, build: Callable[..., Any], kwargs: Mapping[str, Any], call: str, name: str
) -> nn.Module:
    """``build(**kwargs)`` for user or hub code: any exception, or a result that is not an
    ``nn.Module``, becomes an error naming the model (``call`` shows the call, ``name`` the
    callable)."""
    try:
        model = build(**kwargs)
    except Exception as err:  # user code: any exception type
        raise model_error(key, f"{call} failed ({type(err).__name__}: {err})") from err
    if not isinstance(model, nn.Module):
        raise model_error(key, f"{name} returned {type(model).__name__}, not an nn.Module")
    return model
