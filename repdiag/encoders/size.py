"""The size of a model, measured on the meta device before it is built for real.

Each number of a config has its own cap (``repdiag.core.config.SIZE_CAPS``), but numbers under
their caps combine: ``embed_dim`` 65536 with ``depth`` 1000 is a 51.6 G-parameter backbone. So
every model a config or a zoo run's ``meta.json`` can build is also checked as one thing: built
on the meta device (shapes only, nothing allocated), its parameters counted and one image passed
through it, summing the outputs of every module (the activations a forward pass holds at once
when training, an upper bound at inference), and both capped (:func:`check_model_size`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from repdiag.encoders.entries import model_error

MAX_PARAMETERS = 2_000_000_000
"""Parameters of one model: above ViT-g/14 (1.0 G), the largest encoder config/paper.yaml names."""

MAX_ACTIVATION_BYTES = 8 * 2**30
"""Bytes of module outputs for one image: ViT-L/14 at 224 px holds about 0.6 GiB."""


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """``parameters`` and buffers, counted; ``activation_bytes`` of one image's forward pass,
    ``complete`` False when the model stopped on the meta device part way (the bytes of the
    modules it passed are then a lower bound, still capped)."""

    parameters: int
    activation_bytes: int
    complete: bool = True


def model_size(
    model: nn.Module,
    image_size: int,
    forward: Callable[[torch.Tensor], object] | None = None,
) -> ModelSize:
    """Count ``model``'s parameters and run one ``(1, 3, image_size, image_size)`` meta image
    through ``forward`` (default: ``model``), summing every module's tensor outputs in bytes."""
    parameters = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for b in model.buffers()
    )
    total = [0]

    def add(_module: nn.Module, _args: object, output: object) -> None:
        outputs = output if isinstance(output, list | tuple) else [output]
        for tensor in outputs:
            if isinstance(tensor, torch.Tensor):
                total[0] += tensor.numel() * tensor.element_size()

    hooks = [module.register_forward_hook(add) for module in model.modules()]
    try:
        with torch.no_grad():
            (forward or model)(torch.empty(1, 3, image_size, image_size, device="meta"))
        complete = True
    except Exception:  # stopped part way on meta tensors: what it passed is a lower bound
        complete = False
    finally:
        for hook in hooks:
            hook.remove()
    return ModelSize(parameters, total[0], complete)


def check_model_size(
    key: str,
    model: nn.Module,
    image_size: int,
    where: str,
    forward: Callable[[torch.Tensor], object] | None = None,
) -> ModelSize:
    """:func:`model_size` of a model built on the meta device, refused above
    :data:`MAX_PARAMETERS` or :data:`MAX_ACTIVATION_BYTES` with an error naming model ``key``
    and ``where`` its numbers come from (a config key or a meta.json)."""
    if any(p.device.type != "meta" for p in model.parameters()):
        raise ValueError(f"model {key!r}: measure its size on the meta device, before building it")
    size = model_size(model, image_size, forward)
    if size.parameters > MAX_PARAMETERS:
        raise model_error(
            key,
            f"{where} builds {size.parameters / 1e9:.1f} G parameters, above the cap of "
            f"{MAX_PARAMETERS / 1e9:.1f} G (repdiag.encoders.size.MAX_PARAMETERS): its widths, "
            "depths and sizes are each under their caps but together too large; make it smaller",
        )
    if size.activation_bytes > MAX_ACTIVATION_BYTES:
        raise model_error(
            key,
            f"{where}: one {image_size} px image makes "
            f"{'at least ' if not size.complete else ''}{size.activation_bytes / 2**30:.1f} GiB "
            f"of activations, above the cap of {MAX_ACTIVATION_BYTES / 2**30:.0f} GiB "
            "(repdiag.encoders.size.MAX_ACTIVATION_BYTES); use a smaller image size or a larger "
            "patch size",
        )
    return size
