"""Sources ``timm`` (``timm.create_model(id, **kwargs)``; ``pretrained: false`` random weights,
``true`` the local Hugging Face / torch.hub cache, or a local weights file) and ``checkpoint``
(timm architecture ``id`` with weights from the safetensors file ``weights``).

In meta mode both build the architecture alone, on the meta device (``timm <id>``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from repdiag.core.errors import EncoderError
from repdiag.encoders.entries import model_error
from repdiag.encoders.preprocess import from_timm
from repdiag.encoders.sources.base import SOURCES, BuildOptions, Built, close_names
from repdiag.encoders.vit_shortcuts import attach_mae_projection, is_timm_mae, split_mae_decoder
from repdiag.encoders.weights import (
    check_float_slots,
    hf_cache_dir,
    hf_cached,
    load_entry_weights,
    load_safetensors,
    load_weights_file,
)


def timm_cached(key: str, name: str) -> None:
    """Fail before any download when pretrained timm weights are in neither local cache."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg or {})
    hub_id, url = cfg.get("hf_hub_id"), cfg.get("url")
    files = [
        cfg.get("hf_hub_filename"),
        "model.safetensors",
        "pytorch_model.bin",
        "open_clip_model.safetensors",
    ]
    if hub_id and hf_cached(hub_id, [f for f in files if f]):
        return
    if (
        url
        and (Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name).is_file()
    ):
        return
    raise model_error(
        key,
        f"pretrained weights of timm model {name!r} are not in the local Hugging Face cache "
        f"{hf_cache_dir()} ({hub_id or 'no hub id'}) or the torch.hub cache "
        f"{Path(torch.hub.get_dir()) / 'checkpoints'} and nothing is downloaded here: fill the "
        "cache on a machine with internet (timm.create_model(name, pretrained=True)) and copy it "
        "there (HF_HOME), or set pretrained: /path/to/weights.safetensors",
    )


def _check_name(key: str, name: str, what: str) -> None:
    import timm

    if not timm.is_model(name):
        raise model_error(
            key,
            f"{name!r} is not a timm {what}{close_names(name.split('.')[0], timm.list_models())}",
        )


def _architecture(key: str, name: str, kwargs: Mapping[str, Any], options: BuildOptions) -> Built:
    """The timm architecture alone, random weights on the meta device (meta mode)."""
    import timm

    try:
        with options.device():
            model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as err:  # timm raises RuntimeError/TypeError/ValueError/AssertionError
        raise model_error(
            key, f"timm could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    if is_timm_mae(model):  # random weights: the projection too
        attach_mae_projection(model, None)
    return Built(model, from_timm(model), origin=f"timm {name}")


@SOURCES.register("timm")
def build_timm(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    import timm

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    _check_name(key, name, "model")
    if options.meta:
        return _architecture(key, name, kwargs, options)
    pretrained, projection = entry.get("pretrained"), None
    if pretrained is True:
        timm_cached(key, name)
    elif isinstance(pretrained, str):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise model_error(key, f"pretrained weights file {path} does not exist")
        # read by the project's loader (byte check, weights_only=True) and handed to timm as a
        # state dict: timm applies its filters and classifier handling but never opens the file
        state, projection = split_mae_decoder(load_weights_file(path, key))
        overlay: dict[str, Any] = {"state_dict": state}
        if kwargs.get("num_classes"):  # the file's classifier is the one asked for: keep it
            overlay["num_classes"] = kwargs["num_classes"]
        kwargs["pretrained_cfg_overlay"] = overlay
    try:
        model = timm.create_model(name, pretrained=bool(pretrained), **kwargs)
    except EncoderError:
        raise
    except Exception as err:  # timm raises RuntimeError/TypeError/ValueError/AssertionError
        raise model_error(
            key, f"timm could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    if isinstance(pretrained, str):
        check_float_slots(model.state_dict(), state, key, pretrained)
    if is_timm_mae(model) and (not pretrained or projection is not None):
        attach_mae_projection(model, projection)  # timm's own MAE weights have no decoder
    return Built(model, from_timm(model), origin=f"timm {name}")


@SOURCES.register("checkpoint")
def build_checkpoint(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    import timm

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if options.meta:
        _check_name(key, name, "architecture")
        return _architecture(key, name, kwargs, options)
    if not entry.get("weights"):
        raise model_error(key, "source checkpoint needs weights: <file>.safetensors")
    state = load_safetensors(entry["weights"], key)
    _check_name(key, name, "architecture")
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as err:
        raise model_error(
            key, f"timm could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    load_entry_weights(model, state, key, entry)
    return Built(model, from_timm(model), origin=f"timm {name}")
