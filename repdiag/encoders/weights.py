"""Weights of encoders, read safely: safetensors, or, for the files timm/torchvision/hub publish as
``.pth``, ``torch.load(weights_only=True)``; a ``checkpoint``/``zoo`` file must be safetensors and a
pickle is refused without being unpickled (:func:`check_safetensors`). Tensors are checked
(floating point, finite; half precision cast to float32) and loaded by name, shape and dtype
(:func:`load_into`). Every failure is one :class:`~repdiag.core.errors.EncoderError` naming the
model key (:func:`model_error`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repdiag.encoders.entries import check_safetensors, model_error

log = logging.getLogger(__name__)


WEIGHT_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool, torch.complex64,
     torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)  # fmt: skip
"""Dtypes :func:`check_weights` looks at further (bool and complex are then refused by name);
any other (float8 types, unsigned 16-64-bit, quantized) is refused naming model, file and tensor."""


def check_weights(state: Mapping[str, Any], key: str, where: object) -> dict[str, Any]:
    """Refuse bool and non-finite weights naming the tensor; cast float16/bfloat16 to float32.

    Integer tensors pass (index buffers such as ``relative_position_index``); :func:`load_into`
    refuses one where the model has a floating tensor.
    """
    checked, cast = {}, []
    for name, tensor in state.items():
        if isinstance(tensor, torch.Tensor):
            if tensor.dtype not in WEIGHT_DTYPES:
                raise model_error(
                    key,
                    f"{where}: tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}"
                    ", which repdiag does not load (weights: float32, float64, float16, bfloat16; "
                    "index buffers: integers); convert the checkpoint, e.g. "
                    "tensor.to(torch.float32) for float8 weights",
                )
            if tensor.dtype == torch.bool or tensor.is_complex():
                raise model_error(
                    key,
                    f"{where}: tensor {name!r} has dtype {tensor.dtype}; weights must be floating "
                    "point (re-export the checkpoint from the trained model)",
                )
            if tensor.is_floating_point():
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    raise model_error(
                        key,
                        f"{where}: tensor {name!r} holds {bad} non-finite values (NaN/inf); "
                        "the checkpoint is damaged or diverged",
                    )
                if tensor.dtype in (torch.float16, torch.bfloat16):
                    cast.append(f"{name} ({str(tensor.dtype).removeprefix('torch.')})")
                    tensor = tensor.to(torch.float32)
        checked[name] = tensor
    if cast:
        log.warning(
            "model %s: %d half-precision weights of %s cast to float32, e.g. %s",
            key,
            len(cast),
            where,
            cast[:3],
        )
    return checked


def check_float_slots(
    own: Mapping[str, torch.Tensor], state: Mapping[str, Any], key: str, where: object
) -> None:
    """Refuse an integer tensor in ``state`` where the model (``own``) has a floating one."""
    not_float = [
        k
        for k in own
        if isinstance(state.get(k), torch.Tensor)
        and own[k].is_floating_point()
        and not state[k].is_floating_point()
    ]
    if not_float:
        k = not_float[0]
        raise model_error(
            key,
            f"{where}: tensor {k!r} has dtype {state[k].dtype} where the model has "
            f"{own[k].dtype} ({len(not_float)} such tensors); weights must be floating point",
        )


def load_safetensors(path: str | Path, key: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = check_safetensors(path, key)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise model_error(
            key, f"cannot read {path} ({err}); the file is truncated or corrupt"
        ) from err
    return check_weights(state, key, path)


def load_weights_file(path: str | Path, key: str) -> dict[str, torch.Tensor]:
    """A state dict from safetensors, or from a ``.pth``-style file with ``weights_only=True``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise model_error(key, f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        return load_safetensors(path, key)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling refused or corrupt: torch raises several types
        raise model_error(
            key,
            f"cannot read {path} with torch.load(weights_only=True) ({type(err).__name__}: {err})",
        ) from err
    for wrapper in ("state_dict", "model", "module"):
        if (
            isinstance(state, dict)
            and isinstance(state.get(wrapper), dict)
            and not any(isinstance(v, torch.Tensor) for v in state.values())
        ):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise model_error(key, f"{path} holds a {type(state).__name__}, not a state dict")
    return check_weights(state, key, path)


def load_into(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    key: str,
    *,
    prefix: str = "",
    strict: bool = True,
    where: str = "weights",
) -> None:
    """Load ``state`` (keys starting with ``prefix``, prefix removed) into ``module``.

    ``strict=False`` tolerates weights the module does not use (SwAV's prototypes) and removes a
    final classifier (``fc``/``head``/``classifier``) that the weights do not include, instead of
    leaving it random (the Barlow Twins and SwAV hub ResNet-50s); any other missing weight fails.
    """
    if prefix:
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    own = module.state_dict()
    missing = sorted(k for k in set(own) - set(state) if not k.endswith("num_batches_tracked"))
    if missing and not strict:
        for name in ("fc", "head", "classifier"):
            layer = getattr(module, name, None)
            keys = (
                {f"{name}.{k}" for k in layer.state_dict()}
                if isinstance(layer, nn.Module)
                else set()
            )
            if keys and keys <= set(missing):
                setattr(module, name, nn.Identity())
                log.info(
                    "model %s: %s is not in the %s: removed, so the model has no head tap",
                    key,
                    name,
                    where,
                )
                missing = [k for k in missing if k not in keys]
        own = module.state_dict()
    unexpected = sorted(set(state) - set(own))
    if missing:
        raise model_error(
            key, f"{where} lack {len(missing)} weights of the model, e.g. {missing[:5]}"
        )
    if unexpected and strict:
        raise model_error(
            key,
            f"{where} hold {len(unexpected)} weights the model does not have, e.g. {unexpected[:5]} "
            "(set strict: false to ignore them, or state_dict_prefix to select a sub-model)",
        )
    if unexpected:
        log.info(
            "model %s: ignoring %d unused weights, e.g. %s", key, len(unexpected), unexpected[:5]
        )
    check_float_slots(own, state, key, where)
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise model_error(
            key,
            f"{where}: {len(wrong)} weights have the wrong shape, e.g. {k} {tuple(state[k].shape)} "
            f"vs {tuple(own[k].shape)} in the model; check the architecture and kwargs",
        )
    module.load_state_dict({k: state[k] for k in own if k in state}, strict=True)


def load_entry_weights(
    module: nn.Module, state: Mapping[str, torch.Tensor], key: str, entry: Mapping[str, Any]
) -> None:
    """:func:`load_into` with a model entry's own settings: ``state_dict_prefix``, ``strict``
    (default true) and its ``weights`` file named in every error."""
    load_into(
        module,
        state,
        key,
        prefix=entry.get("state_dict_prefix") or "",
        strict=entry.get("strict", True),
        where=str(entry["weights"]),
    )


def hf_cached(repo_id: str, filenames: Iterable[str]) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in filenames:
        found = try_to_load_from_cache(repo_id, filename)
        if isinstance(found, str):
            return found
    return None


def hf_cache_dir() -> str:
    """The Hugging Face hub cache folder this process reads (HF_HUB_CACHE, HF_HOME/hub, ...)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return "(huggingface_hub not installed)"
    return str(constants.HF_HUB_CACHE)
