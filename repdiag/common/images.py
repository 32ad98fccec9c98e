"""The one image reader: every image a job decodes (image folders, CIFAR-10 folders, SugarCrepe,
Jacobian probe folders) is opened, checked and decoded here.

:func:`read_rgb` takes a path and :class:`ReadOptions` and

1. opens only a regular file: the path is resolved and must stay inside ``options.root`` (a
   symbolic link, at any component, that leads out of the tree is refused); the file is opened
   with ``O_NOFOLLOW | O_NONBLOCK`` and ``fstat`` must say "regular file" of one name, so a FIFO
   or a device named ``*.png`` is refused at once instead of blocking the job forever, and a
   hard link (whose other name may be anywhere) is refused like a link out of the tree;
2. reads the header only and refuses, naming the file, an image over the pixel budget
   (:data:`MAX_IMAGE_PIXELS`, ``REPDIAG_MAX_IMAGE_PIXELS``; a 16-bit, 32-bit or float pixel
   charged as 2 or 3, :func:`mode_cost`), with a side ratio over ``options.max_aspect``, or of
   another size than ``options.shape``, and a JPEG of more than :data:`MAX_JPEG_SCANS` scans;
3. decodes (JPEG at the smallest power-of-two scale that still covers the output, PIL's
   ``draft``), then, with ``options.size``, resamples only the centre square to ``size x size``
   (crop before resize: a 20000 x 1 image costs 20000 pixels, not 4.48 M x 224);
4. converts by mode: 8-bit modes (grey, palette, CMYK, alpha) through ``convert("RGB")``;
   16-bit grey (``I;16*``) scaled from 0..65535; 32-bit integer (``I``) and float (``F``) images
   from their own min..max (a float image already inside [0, 1] taken as is), in row blocks. PIL's ``convert``
   would clip those to 0..255 (nearly all white) or truncate them.

:data:`DECODED` counts the files and pixels decoded in this process (what the reliability tests
bound). Callers list a folder with :func:`list_images` and decode only the files they keep.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from repdiag.core.digests import folder_entries
from repdiag.core.errors import RepdiagError

MAX_IMAGE_PIXELS = 50_000_000
"""Largest image (width x height) decoded; ``REPDIAG_MAX_IMAGE_PIXELS`` overrides it."""
MAX_ASPECT = 50.0
"""Largest ratio of an image's long side to its short side."""
MAX_JPEG_SCANS = 64
"""Scans a JPEG may hold: each scan is a pass over the whole image (a baseline JPEG has 1, a
progressive one about 10); 15,000 repeated scans in 1.3 MB took 55 s to decode."""
CONVERT_BLOCK = 1 << 20
"""Pixels converted at a time from a 16-bit, 32-bit or float image (float64 temporaries)."""


class ImageError(RepdiagError, ValueError):
    """An image file is refused (not a regular file, out of the tree, over a budget, unreadable)."""


@dataclasses.dataclass
class DecodeCount:
    """Files and pixels decoded by :func:`read_rgb` in this process."""

    files: int = 0
    pixels: int = 0

    def reset(self) -> None:
        self.files = self.pixels = 0


DECODED = DecodeCount()


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """What :func:`read_rgb` accepts and returns.

    ``root``: files must resolve inside it (default: the file's own folder). ``max_pixels``:
    the pixel budget (None: :func:`max_image_pixels`). ``max_aspect``: long side / short side.
    ``shape``: the required ``(width, height)``. ``size``: resample the centre square to
    ``size x size``; ``square``: crop the centre square (no resize).
    """

    root: str | Path | None = None
    max_pixels: int | None = None
    max_aspect: float = MAX_ASPECT
    shape: tuple[int, int] | None = None
    size: int | None = None
    square: bool = False


def max_image_pixels() -> int:
    """The pixel budget: ``$REPDIAG_MAX_IMAGE_PIXELS`` when set, else :data:`MAX_IMAGE_PIXELS`."""
    value = os.environ.get("REPDIAG_MAX_IMAGE_PIXELS")
    if value is None:
        return MAX_IMAGE_PIXELS
    try:
        return int(value)
    except ValueError:
        raise ImageError(
            f"REPDIAG_MAX_IMAGE_PIXELS={value!r} is not an integer number of pixels"
        ) from None


def list_images(folder: str | Path, suffixes: Sequence[str], recursive: bool = True) -> list[Path]:
    """The entries of :func:`repdiag.core.digests.folder_entries` (the manifest's listing: hidden
    entries left out, links to folders not descended) whose suffix (any case) is in
    ``suffixes``, sorted by path; a link or a FIFO is listed and judged by :func:`read_rgb`."""
    wanted = tuple(s.lower() for s in suffixes)
    return [
        path for path in folder_entries(folder, recursive) if path.name.lower().endswith(wanted)
    ]


def _open_regular(path: Path, root: Path) -> Any:
    """A binary stream of ``path``, which must resolve inside ``root`` and be a regular file."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as err:
        raise ImageError(f"image {path} cannot be opened ({err})") from err
    if not real.is_relative_to(root):
        raise ImageError(
            f"image {path} is a symbolic link to {real}, outside {root}; images are read only "
            "inside their folder: copy the file in or link the whole folder"
        )
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as err:
        raise ImageError(f"image {path} cannot be opened ({err})") from err
    info = os.fstat(fd)
    mode = info.st_mode
    if stat.S_ISREG(mode) and info.st_nlink > 1:
        os.close(fd)
        raise ImageError(
            f"image {path} is a hard link ({info.st_nlink} names): its other names may lie "
            "outside the folder, which is read as a unit; copy the file in"
        )
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else ""
        raise ImageError(
            f"image {path} is not a regular file ({kind or 'a device or socket'}); "
            "remove it from the folder"
        )
    return os.fdopen(fd, "rb")


def mode_cost(mode: str) -> int:
    """Memory of decoding one pixel of ``mode``, in 8-bit RGB pixels (3 bytes): 1 for 8-bit
    modes; 2 for 16-bit grey (2 bytes read, 1 grey and 3 RGB written); 3 for 32-bit integer and
    float images (4 + 1 + 3). The pixel budget is charged this many pixels per pixel."""
    if mode.startswith("I;16"):
        return 2
    return 3 if mode in ("I", "F") else 1


def _check_header(path: Path, image: Any, options: ReadOptions) -> None:
    width, height = image.size
    limit = max_image_pixels() if options.max_pixels is None else options.max_pixels
    cost = mode_cost(image.mode)
    if width * height * cost > limit:
        deeper = f" (x{cost}: {image.mode} pixels take {cost} times the memory)" if cost > 1 else ""
        # the variable sets only the default budget; a reader's own limit is fixed
        raise_it = " or raise REPDIAG_MAX_IMAGE_PIXELS" if options.max_pixels is None else ""
        raise ImageError(
            f"image {path} is {width} x {height} = {width * height} pixels{deeper}, over the "
            f"budget of {limit}; shrink it{' or' if not raise_it else ','} remove it from the folder"
            f"{raise_it}"
        )
    if min(width, height) < 1 or max(width, height) > options.max_aspect * min(width, height):
        raise ImageError(
            f"image {path} is {width} x {height}: its sides differ by more than "
            f"{options.max_aspect:g} times; crop it or remove it from the folder"
        )
    if options.shape is not None and (width, height) != tuple(options.shape):
        raise ImageError(
            f"image {path} is {width} x {height}; the other images of its set are "
            f"{options.shape[0]} x {options.shape[1]}: every image must have one size"
        )


def _check_scans(path: Path, stream: Any) -> None:
    """At most :data:`MAX_JPEG_SCANS` start-of-scan markers (``FF DA``) in the file. Entropy-coded
    data stuffs every ``FF`` byte with ``00``, so ``FF DA`` is a marker wherever it appears (an
    embedded thumbnail's scans count too); read in blocks, the stream put back where it was."""
    where, scans, tail = stream.tell(), 0, b""
    stream.seek(0)
    while block := stream.read(1 << 20):
        data = tail + block
        scans += data.count(b"\xff\xda")
        tail = data[-1:]
        if scans > MAX_JPEG_SCANS:
            raise ImageError(
                f"image {path} is a JPEG of more than {MAX_JPEG_SCANS} scans, each a pass over "
                "the whole image; re-encode it (a progressive JPEG has about 10)"
            )
    stream.seek(where)


def _to_rgb(image: Any) -> Any:
    """``image`` (decoded) as an 8-bit RGB PIL image, converted by its mode (module doc, 4)."""
    from PIL import Image

    mode = image.mode
    if not (mode.startswith("I;16") or mode in ("I", "F")):
        return image if mode == "RGB" else image.convert("RGB")
    values = np.asarray(image)  # its own 2 or 4 bytes a pixel; scaled in row blocks below
    if mode.startswith("I;16"):
        low, high = 0.0, 65535.0
    else:
        finite = values[np.isfinite(values)] if mode == "F" else values
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        if mode == "F" and low >= 0 and high <= 1:
            low, high = 0.0, 1.0
    grey = np.empty(values.shape, np.uint8)
    rows = max(1, CONVERT_BLOCK // max(1, values.shape[1]))
    for start in range(0, values.shape[0], rows):
        block = values[start : start + rows].astype(np.float64)
        scaled = (block - low) / (high - low) if high > low else block * 0.0
        grey[start : start + rows] = np.round(np.nan_to_num(scaled, nan=0.0).clip(0, 1) * 255)
    return Image.fromarray(np.repeat(grey[..., None], 3, axis=2), "RGB")


def _centre_square(width: int, height: int) -> tuple[float, float, float, float]:
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _decode(image: Any, path: Path, options: ReadOptions) -> Any:
    from PIL import Image

    width, height = image.size
    if options.size is not None and image.format == "JPEG":
        scale = options.size / min(width, height)
        image.draft("RGB", (max(1, round(width * scale)), max(1, round(height * scale))))
    image.load()
    DECODED.files += 1
    DECODED.pixels += image.size[0] * image.size[1]
    rgb = _to_rgb(image)
    if options.size is not None:
        size = int(options.size)
        box = _centre_square(*rgb.size)
        return rgb.resize((size, size), Image.Resampling.BICUBIC, box=box)
    if options.square:
        return rgb.crop(tuple(round(v) for v in _centre_square(*rgb.size)))
    return rgb


def read_rgb(path: str | Path, options: ReadOptions | None = None) -> Any:
    """The image at ``path`` as an 8-bit RGB ``PIL.Image`` (file closed), checked as the module
    doc says; :class:`ImageError` naming the file otherwise."""
    from PIL import Image, UnidentifiedImageError

    options = options or ReadOptions()
    path = Path(path)
    root = Path(options.root if options.root is not None else path.parent).resolve()
    with _open_regular(path, root) as stream:
        try:
            with Image.open(stream) as image:
                _check_header(path, image, options)
                if image.format == "JPEG":
                    _check_scans(path, stream)
                return _decode(image, path, options)
        except Image.DecompressionBombError as err:
            raise ImageError(f"image {path} is refused by PIL as too large ({err})") from err
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
            if isinstance(err, ImageError):
                raise
            raise ImageError(
                f"cannot read image {path} ({err}); the file is corrupt or truncated"
            ) from err


def read_rgb_array(path: str | Path, options: ReadOptions | None = None) -> np.ndarray:
    """:func:`read_rgb` as a uint8 array ``(H, W, 3)``."""
    return np.asarray(read_rgb(path, options), dtype=np.uint8)
