"""Source ``python``: ``package.module:callable`` called with ``kwargs``, returning an
``nn.Module``. Preprocessing: timm's for a timm model, the module's own ``preprocess_cfg``, else
ImageNet's at 224 px.

In meta mode the module is built as it is (user code, on the CPU: it may make tensors of its
own), then moved to the meta device (``python <id>``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from torch import nn

from repdiag.core.errors import EncoderError
from repdiag.encoders.entries import model_error
from repdiag.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess, from_timm
from repdiag.encoders.sources.base import META, SOURCES, BuildOptions, Built, call_module_builder


@SOURCES.register("python")
def build_python(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    target = str(entry["id"])
    model = _call(key, target, dict(entry.get("kwargs") or {}))
    if options.meta:
        model.to(META)
    return built_from_module(key, model, f"python {target}")


def built_from_module(key: str, model: nn.Module, origin: str) -> Built:
    """``model`` with its preprocessing: timm's for a timm model, its own ``preprocess_cfg``,
    else ImageNet's at 224 px."""
    if any(cls.__module__.startswith("timm.models") for cls in type(model).__mro__):
        return Built(model, from_timm(model), origin=origin)
    own = getattr(model, "preprocess_cfg", None)
    if isinstance(own, Mapping):
        try:
            return Built(model, Preprocess(**own), origin=origin)
        except (TypeError, EncoderError) as err:
            raise model_error(key, f"{origin}: bad preprocess_cfg {dict(own)} ({err})") from err
    return Built(model, Preprocess(224, IMAGENET_MEAN, IMAGENET_STD, "bicubic"), origin=origin)


def _call(key: str, target: str, kwargs: dict[str, Any]) -> nn.Module:
    """``package.module:callable(**kwargs)``, which must return an ``nn.Module``."""
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise model_error(
            key, f"cannot import {module_name!r} ({err}); is it installed or on PYTHONPATH?"
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise model_error(key, f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise model_error(key, f"{target} is not callable")
    return call_module_builder(key, obj, kwargs, f"{target}(**{kwargs})", f"{target}(**kwargs)")
