"""Image preprocessing of an encoder: resize, scale to [0, 1], normalise per channel.

An encoder's preprocessing comes from the model's own configuration (timm's data config, open_clip's
``preprocess_cfg``, torchvision's weights transforms, the zoo's ``meta.json``), optionally
overridden key by key by the ``preprocess:`` mapping of its config entry.

``Preprocess(images)`` maps uint8 images ``(N, H, W, 3)`` (numpy or torch) to float32
``(N, 3, S, S)``::

    x = resize(images / 255, (S, S), interpolation)    # whole image, no crop
    x = (clamp(x, 0, 1) - mean) / std                   # per channel

The whole synthetic scene is resized, never cropped: cropping would cut objects out of their grid
slots. Natural images of any size are read by :func:`load_image_folder`, which resamples the centre
square to ``S`` (what resizing the shorter side to ``S`` and centre-cropping gives, as timm and
torchvision evaluation transforms do with crop_pct = 1), through the one image reader
:mod:`repdiag.common.images`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from repdiag.common.images import (
    ImageError,
    ReadOptions,
    list_images,
    read_rgb_array,
)
from repdiag.core.errors import EncoderError

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _interpolation_name(value: Any) -> str:
    """Map a library's interpolation (str or torchvision InterpolationMode) to ours."""
    name = str(getattr(value, "value", value)).lower()
    return name if name in INTERPOLATIONS else "bicubic"


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """Resize to ``input_size`` x ``input_size``, scale to [0, 1], subtract ``mean``, divide by ``std``."""

    input_size: int
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_size", int(self.input_size))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if self.input_size < 1:
            raise EncoderError(f"preprocess.input_size must be positive, got {self.input_size}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise EncoderError(
                f"preprocess.mean/std need 3 values each and std > 0, got {self.mean} / {self.std}"
            )
        if self.interpolation not in INTERPOLATIONS:
            raise EncoderError(
                f"preprocess.interpolation {self.interpolation!r} is not one of {INTERPOLATIONS}"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_size": self.input_size,
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
        }

    def updated(self, overrides: Mapping[str, Any] | None) -> Preprocess:
        """A copy with the keys of a config ``preprocess:`` mapping replaced."""
        if not overrides:
            return self
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise EncoderError(f"unknown preprocess keys {sorted(unknown)}")
        return dataclasses.replace(self, **dict(overrides))

    def __call__(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(images)
        if x.ndim != 4 or x.shape[-1] != 3:
            raise EncoderError(
                f"preprocess expects images (N, H, W, 3), got shape {tuple(x.shape)}"
            )
        if x.dtype != torch.uint8 and not x.is_floating_point():
            raise EncoderError(f"preprocess expects uint8 or float images in [0, 1], got {x.dtype}")
        size = (self.input_size, self.input_size)
        fresh = x.dtype == torch.uint8  # a new float tensor follows: in-place ops are safe on it
        x = x.permute(0, 3, 1, 2).contiguous()  # NCHW, copied while still 1 byte per value
        x = x.to(torch.float32).div_(255.0) if fresh else x
        if tuple(x.shape[-2:]) != size:
            smooth = self.interpolation != "nearest"
            x = F.interpolate(
                x,
                size=size,
                mode=self.interpolation,
                align_corners=False if smooth else None,
                antialias=smooth,
            )
            x = x.clamp(0.0, 1.0)  # bicubic overshoots; PIL-based transforms clip to uint8 too
            fresh = True
        # (x - mean) / std as x * (1 / std) + (-mean / std)
        scale = torch.tensor([1.0 / s for s in self.std], dtype=x.dtype, device=x.device).view(
            1, 3, 1, 1
        )
        shift = torch.tensor(
            [-m / s for m, s in zip(self.mean, self.std, strict=True)],
            dtype=x.dtype,
            device=x.device,
        ).view(1, 3, 1, 1)
        if fresh and not x.requires_grad:
            return x.mul_(scale).add_(shift)
        return x * scale + shift


def from_timm(model: torch.nn.Module) -> Preprocess:
    """timm's own data config (``resolve_model_data_config``) at the size the model was built for.

    timm keeps the pretrained config's 224 px when a ViT is built with another ``img_size``, so
    the patch embedding's actual image size wins when there is one.
    """
    from timm.data import resolve_model_data_config

    cfg = resolve_model_data_config(model)
    size = int(cfg["input_size"][-1])
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None and not getattr(model, "dynamic_img_size", False):
        size = int(img_size[-1] if isinstance(img_size, (tuple, list)) else img_size)
    return Preprocess(size, cfg["mean"], cfg["std"], _interpolation_name(cfg["interpolation"]))


def from_open_clip(cfg: Mapping[str, Any]) -> Preprocess:
    """open_clip's ``preprocess_cfg`` (size, mean, std, interpolation) of the model or its tag."""
    size = cfg["size"]
    size = size[-1] if isinstance(size, (tuple, list)) else size
    return Preprocess(int(size), cfg["mean"], cfg["std"], _interpolation_name(cfg["interpolation"]))


def from_torchvision(weights: Any | None) -> Preprocess:
    """The evaluation transform of torchvision weights (crop size, mean, std, interpolation)."""
    if weights is None:
        return Preprocess(224, IMAGENET_MEAN, IMAGENET_STD, "bilinear")
    tf = weights.transforms()
    size = tf.crop_size[0] if isinstance(tf.crop_size, (list, tuple)) else tf.crop_size
    return Preprocess(int(size), tf.mean, tf.std, _interpolation_name(tf.interpolation))


FOLDER_MAX_IMAGES = 20_000
"""Images of one folder decoded into memory at once (at 224 px, 2.8 GiB): 15,000 1 x 1 PNGs
(1 MB on disk) would otherwise become 2.3 GB of upsampled pixels."""


def load_image_folder(
    folder: str | Path, size: int, limit: int | None = None
) -> tuple[list[str], np.ndarray]:
    """The images under ``folder`` (recursive, sorted; the first ``limit`` when given), as uint8
    ``(N, size, size, 3)``.

    Each image is read by :func:`repdiag.common.images.read_rgb`: a regular file inside
    ``folder``, within the pixel budget and side ratio, converted by mode, and its centre square
    resampled to ``size`` x ``size`` (bicubic), which is what resizing the shorter side to
    ``size`` and centre-cropping gives, without ever resizing the long side. Only the kept files
    are decoded, at most :data:`FOLDER_MAX_IMAGES`. Ids are ``folder/<relative path>``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise EncoderError(f"image folder {folder} does not exist (config key embeddings.folder)")
    paths = list_images(folder, IMAGE_SUFFIXES)[:limit]
    if len(paths) > FOLDER_MAX_IMAGES:  # each kept image becomes size x size x 3 bytes
        raise EncoderError(
            f"image folder {folder} holds {len(paths)} images, over {FOLDER_MAX_IMAGES} "
            f"({FOLDER_MAX_IMAGES * size * size * 3 / 2**30:.1f} GiB at {size} px); point "
            "embeddings.folder at a subset of at most that many"
        )
    if not paths:
        raise EncoderError(
            f"image folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}); "
            "set embeddings.folder to a folder of natural images or to null"
        )
    options = ReadOptions(root=folder, size=size)
    images = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            images[i] = read_rgb_array(path, options)
        except ImageError as err:
            raise EncoderError(str(err)) from err
    ids = [f"folder/{p.relative_to(folder).as_posix()}" for p in paths]
    return ids, images
