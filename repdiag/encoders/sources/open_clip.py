"""Source ``open_clip``: ``open_clip.create_model(id, pretrained=tag or file, **kwargs)``; the image
tower (``model.visual``) is the encoder. Nothing is downloaded: a pretrained tag must be in the
local cache, and a local file is read by the project's loader, never by open_clip.

In meta mode the tower is built alone, random weights on the meta device (``open_clip <id>``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from repdiag.core.errors import ConfigError, EncoderError
from repdiag.encoders.entries import is_local_path, model_error
from repdiag.encoders.preprocess import from_open_clip
from repdiag.encoders.sources.base import META, SOURCES, BuildOptions, Built, close_names
from repdiag.encoders.weights import check_float_slots, hf_cached, load_weights_file


def resolve_open_clip_pretrained(key: str, name: str, pretrained: object) -> str | None:
    """A local weights file or a cached pretrained tag of ``name``; ``None`` for random weights."""
    import open_clip

    if not pretrained:
        return None
    pretrained = str(pretrained)
    if is_local_path(pretrained):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise model_error(key, f"pretrained weights file {path} does not exist")
        return str(path)
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained not in tags:
        raise model_error(key, f"{pretrained!r} is not a pretrained tag of {name}; tags: {tags}")
    open_clip_cached(key, name, pretrained)
    return pretrained


def open_clip_cached(key: str, name: str, tag: str) -> None:
    import open_clip

    cfg = open_clip.get_pretrained_cfg(name, tag)
    hub = (cfg.get("hf_hub") or "").strip("/")
    if hub and hf_cached(hub, ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]):
        return
    url = cfg.get("url")
    if url and (Path("~/.cache/clip").expanduser() / Path(urlparse(url).path).name).is_file():
        return
    raise model_error(
        key,
        f"open_clip weights {name}/{tag} are not in the local cache ({hub or url}) and nothing is "
        "downloaded here: copy the cache from a machine with internet or set pretrained to a local file",
    )


def _open_clip_load_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """What ``open_clip.load_checkpoint`` does after reading its file, on an already-read state."""
    from open_clip import factory

    if state and next(iter(state)).startswith("module."):
        state = {k[len("module.") :]: v for k, v in state.items()}
    state = factory.convert_state_dict(model, state)
    if "positional_embedding" in state and not hasattr(model, "positional_embedding"):
        state = factory.convert_to_custom_text_state_dict(state)
    for name in ("logit_scale", "logit_bias"):
        own = getattr(model, name, None)
        if name in state and own is not None and own.ndim != state[name].ndim:
            state[name] = state[name].reshape(own.shape)
    if "logit_bias" not in state and getattr(model, "logit_bias", None) is not None:
        state["logit_bias"] = torch.zeros_like(state["logit_scale"])
    state.pop("text.transformer.embeddings.position_ids", None)
    factory.resize_pos_embed(state, model)
    factory.resize_text_pos_embed(state, model)
    model.load_state_dict(state, strict=True)


def create_open_clip(
    key: str,
    name: str,
    pretrained: str | None,
    kwargs: Mapping[str, Any],
    *,
    meta: bool = False,
) -> nn.Module:
    """``open_clip.create_model`` with only allowlisted ``kwargs`` (see ``entries.check_kwargs``);
    a local weights file is read by :func:`load_weights_file` and loaded as a state dict, so
    open_clip never opens (or unpickles) a file itself. ``pretrained``: as resolved by
    :func:`resolve_open_clip_pretrained`; ``meta``: random weights on the meta device."""
    import open_clip

    from repdiag.encoders.entries import check_kwargs

    try:
        check_kwargs(key, {"source": "open_clip", "kwargs": kwargs})
    except ConfigError as err:
        raise model_error(key, str(err)) from None
    kwargs = dict(kwargs)
    state, weights_file = None, pretrained
    if pretrained and is_local_path(pretrained):
        state = load_weights_file(pretrained, key)
        pretrained = None
        kwargs.update(pretrained_image=False, pretrained_text=False)
    if meta:  # open_clip moves the model to ``device`` (the CPU unless told)
        kwargs["device"] = META
    model = open_clip.create_model(name, pretrained=pretrained or None, **kwargs)
    if state is not None:
        check_float_slots(model.state_dict(), state, key, weights_file)
        _open_clip_load_state(model, state)
    return model


@SOURCES.register("open_clip")
def build_open_clip(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    import open_clip

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if name not in open_clip.list_models():
        raise model_error(
            key, f"{name!r} is not an open_clip model{close_names(name, open_clip.list_models())}"
        )
    pretrained = None if options.meta else entry.get("pretrained")
    if pretrained is True:
        raise model_error(
            key, "open_clip needs pretrained: a tag (e.g. openai) or a local file, not true"
        )
    pretrained = resolve_open_clip_pretrained(key, name, pretrained)
    try:
        with options.device():
            model = create_open_clip(key, name, pretrained, kwargs, meta=options.meta)
    except EncoderError:
        raise
    except Exception as err:  # open_clip raises RuntimeError/ValueError/TypeError
        raise model_error(
            key, f"open_clip could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    preprocess = from_open_clip(open_clip.get_model_preprocess_cfg(model))
    return Built(model.visual, preprocess, origin=f"open_clip {name}")
