"""Backbones of the zoo: any timm model, built headless so encoder taps see the same modules.

A small ViT (``vit_tiny_patch16_224`` with patch size, width, depth and heads from the config,
at 64 px) and a small ResNet (``resnet10t`` with narrower stages) by default. The complete
keyword arguments are recorded so ``timm.create_model(timm_model, **timm_kwargs)`` rebuilds the
exact architecture (``pretrained`` is never set: no weights are downloaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import timm
import torch
from torch import nn

from repdiag.core.errors import EncoderError


def _accepts(timm_model: str, kwargs: Mapping[str, Any], name: str, value: Any) -> bool:
    """Whether ``timm_model`` takes keyword ``name`` (probed on the meta device: no allocation)."""
    try:
        timm.create_model(timm_model, pretrained=False, device="meta", **{**kwargs, name: value})
    except TypeError as err:
        if name in str(err):
            return False
        raise EncoderError(
            f"timm model {timm_model!r} rejects kwargs {dict(kwargs)}: {err}"
        ) from err
    return True


def backbone_kwargs(
    timm_model: str,
    timm_kwargs: Mapping[str, Any],
    image_size: int,
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Complete kwargs: ``num_classes=0`` (pooled features), then ``img_size=image_size`` and each
    of ``extras`` (e.g. DINO's ``dynamic_img_size``) when the model takes it and the config has
    not set it."""
    if not timm.is_model(timm_model):
        raise EncoderError(f"{timm_model!r} is not a timm architecture (see timm.list_models())")
    kwargs = {"num_classes": 0, **dict(timm_kwargs)}
    for name, value in {"img_size": image_size, **dict(extras or {})}.items():
        if name not in kwargs and _accepts(timm_model, kwargs, name, value):
            kwargs[name] = value
    return kwargs


def build_backbone(timm_model: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """``timm.create_model(timm_model, **kwargs)`` with random weights; errors name the model."""
    if not timm.is_model(timm_model):
        raise EncoderError(f"{timm_model!r} is not a timm architecture (see timm.list_models())")
    try:
        return timm.create_model(timm_model, pretrained=False, **kwargs)
    except TypeError as err:
        raise EncoderError(
            f"timm model {timm_model!r} rejects kwargs {dict(kwargs)}: {err}"
        ) from err


def is_vit(model: nn.Module) -> bool:
    """A patch-token transformer with a class token and learned absolute position embedding."""
    return all(hasattr(model, a) for a in ("patch_embed", "blocks", "pos_embed", "cls_token"))


def pooling(model: nn.Module) -> str:
    """How ``model(x)`` pools: ``cls`` (ViT class token) or ``mean`` (average of tokens / maps)."""
    return "cls" if getattr(model, "global_pool", None) == "token" else "mean"


def memory_format(model: nn.Module, device: torch.device | str) -> torch.memory_format:
    """The layout a backbone trains fastest in: ``channels_last`` for a ConvNet on the CPU
    (oneDNN's convolutions, batch norm and pooling run natively in it, 1.3x or more on the zoo
    ResNet, benchmarks/zoo.py), the default contiguous layout for a ViT or on another device."""
    if torch.device(device).type == "cpu" and not is_vit(model):
        return torch.channels_last
    return torch.contiguous_format


def feature_dim(model: nn.Module) -> int:
    return int(model.num_features)


def vit_patch_tokens(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Patch embeddings plus their position embeddings, (B, N, D), before any block."""
    tokens = model.patch_embed(x)
    if tokens.ndim == 4:  # dynamic_img_size keeps (B, h, w, D)
        tokens = tokens.flatten(1, 2)
    return tokens + model.pos_embed[:, model.num_prefix_tokens :]


def vit_encode_tokens(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Prepend the class token, run the blocks and the final norm: (B, 1 + N, D)."""
    cls = model.cls_token.expand(tokens.shape[0], -1, -1) + model.pos_embed[:, :1]
    x = model.norm_pre(torch.cat([cls, tokens], dim=1))
    return model.norm(model.blocks(x))
