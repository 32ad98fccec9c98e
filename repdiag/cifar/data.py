"""CIFAR-10 (Krizhevsky 2009) from a local directory: the python-pickle batches or an image folder.

Two layouts are read, found automatically under ``data_dir`` (``cifar.data_dir``):

- ``pickle``: the "python version" of https://www.cs.toronto.edu/~kriz/cifar.html, extracted:
  ``<data_dir>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}`` (or those files
  directly in ``<data_dir>``). Each batch is a pickled dict with ``data`` (N, 3072) uint8, rows
  of 1024 red, 1024 green then 1024 blue values in row-major order, and ``labels`` (N ints).
- ``folder``: ``<data_dir>/train/<class>/*.png`` and ``<data_dir>/test/<class>/*.png``; the class
  names are the sorted sub-folder names of ``train``.

Pickle safety: batches are read by :mod:`repdiag.cifar.pickles` (an allow-list unpickler; no
global but numpy's array rebuilders, every array filled from its own bytes). Image folders are read
by the one image reader, :mod:`repdiag.common.images`.

``python -m repdiag.cifar.data download DIR`` fetches and verifies the official archive (needs
internet); ``python -m repdiag.cifar.data fixture DIR`` writes a small synthetic stand-in in the
same format (what the tests and ``config/cifar_smoke.yaml`` use).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from repdiag.cifar.pickles import NumpyOnlyUnpickler, read_pickle_batch  # noqa: F401 (API)
from repdiag.common.images import ImageError, ReadOptions, list_images, read_rgb_array
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import atomic_path

log = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
BATCH_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm")
LAYOUTS = ("auto", "pickle", "folder")


@dataclasses.dataclass(frozen=True)
class Split:
    """One split: ``images`` uint8 (N, H, W, 3), ``labels`` int64 (N,) indices into the classes."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class CifarData:
    train: Split
    test: Split
    classes: tuple[str, ...]
    root: Path
    layout: str

    @property
    def image_size(self) -> int:
        return int(self.train.images.shape[1])


def missing_data_message(data_dir: str | Path) -> str:
    """Where to put CIFAR-10 and how to get it (the error text when ``data_dir`` holds neither layout)."""
    d = Path(data_dir)
    return (
        f"CIFAR-10 was not found in {d} (config key cifar.data_dir). Put it there in one of two "
        f"layouts: (1) the python version, extracted, giving {d / BATCH_DIR}/data_batch_1 ... "
        f"data_batch_5 and test_batch: download cifar-10-python.tar.gz from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html and run `tar xzf cifar-10-python.tar.gz "
        f"-C {d}`, or run `python -m repdiag.cifar.data download {d}` on a machine with "
        f"internet; (2) an image folder {d}/train/<class>/*.png and {d}/test/<class>/*.png. "
        "Then set cifar.data_dir to that directory (relative paths are relative to the "
        "workflow directory)."
    )


def locate(data_dir: str | Path | None, layout: str = "auto") -> tuple[str, Path]:
    """``(layout, root)``: the directory holding the batches (pickle) or ``train``/``test`` (folder).

    Raises :class:`ConfigError` with :func:`missing_data_message` when neither layout is there.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"cifar.format must be one of {LAYOUTS}, got {layout!r}")
    if data_dir is None:
        raise ConfigError(
            "cifar.data_dir is not set: " + missing_data_message("<data_dir>").split(". ", 1)[1]
        )
    base = Path(data_dir)
    if layout in ("auto", "pickle"):
        for root in (base / BATCH_DIR, base):
            if (root / TEST_BATCH).is_file() and all(
                (root / name).is_file() for name in TRAIN_BATCHES
            ):
                return "pickle", root
    if layout in ("auto", "folder") and (base / "train").is_dir() and (base / "test").is_dir():
        return "folder", base
    raise ConfigError(missing_data_message(base))


def data_files(data_dir: str | Path | None, layout: str = "auto") -> list[str]:
    """The paths a run reads (the batch files, or the two split folders): Snakemake inputs."""
    found, root = locate(data_dir, layout)
    if found == "pickle":
        return [str(root / name) for name in (*TRAIN_BATCHES, TEST_BATCH)]
    return [str(root / "train"), str(root / "test")]


def _batch_split(path: Path) -> Split:
    batch = read_pickle_batch(path)
    for key in ("data", "labels"):
        if key not in batch:
            raise StoreError(f"{path}: the batch has no {key!r} entry (keys: {sorted(batch)})")
    data = batch["data"]
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise StoreError(f"{path}: 'data' must be a uint8 array (N, 3 * H * W)")
    side = math.isqrt(data.shape[1] // 3)
    if 3 * side * side != data.shape[1] or len(labels) != len(data):
        raise StoreError(
            f"{path}: 'data' has shape {data.shape} and 'labels' {len(labels)} entries; "
            "expected (N, 3 * S * S) for square S x S images and N labels"
        )
    images = data.reshape(-1, 3, side, side).transpose(0, 2, 3, 1)  # channel-major rows -> NHWC
    return Split(np.ascontiguousarray(images), labels)


def _concat(splits: Sequence[Split]) -> Split:
    return Split(
        np.concatenate([s.images for s in splits]), np.concatenate([s.labels for s in splits])
    )


def _read_pickle_layout(root: Path) -> tuple[Split, Split, tuple[str, ...]]:
    train = _concat([_batch_split(root / name) for name in TRAIN_BATCHES])
    test = _batch_split(root / TEST_BATCH)
    classes = CIFAR10_CLASSES
    if (root / META_FILE).is_file():
        meta = read_pickle_batch(root / META_FILE)
        names = meta.get("label_names")
        if names:
            classes = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    return train, test, classes


FOLDER_MAX_PIXELS = 1 << 20
"""Largest image of a CIFAR folder (1024 x 1024): CIFAR-like sets hold small images."""
FOLDER_MAX_FILES = 1_000_000
"""Most files listed in one split folder (CIFAR-10 holds 50,000 training images)."""
SPLIT_MAX_PIXELS = 1 << 28
"""Most pixels decoded for one split (805 MB as 8-bit RGB): 262,144 CIFAR images of 32 x 32."""


def _list_folder_split(split_dir: Path, classes: Sequence[str]) -> tuple[list[Path], np.ndarray]:
    """The image files of ``split_dir/<class>/`` and their labels, listed (not opened), at most
    :data:`FOLDER_MAX_FILES`."""
    paths: list[Path] = []
    labels: list[int] = []
    for index, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            raise StoreError(f"{class_dir} is missing: {split_dir} must have one folder per class")
        found = list_images(class_dir, IMAGE_SUFFIXES, recursive=False)
        paths += found
        labels += [index] * len(found)
        if len(paths) > FOLDER_MAX_FILES:
            raise StoreError(
                f"{split_dir} lists more than {FOLDER_MAX_FILES} image files; a CIFAR-like "
                "folder holds tens of thousands: point cifar.data_dir at the right folder"
            )
    if not paths:
        raise StoreError(f"{split_dir} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return paths, np.asarray(labels, dtype=np.int64)


def _read_folder_split(split_dir: Path, classes: Sequence[str], n: int | None = None) -> Split:
    """The images of ``split_dir/<class>/`` that the class-balanced subset of ``n`` keeps
    (:func:`balanced_subset`, chosen from the listing before any file is decoded; all when
    ``n`` is None), read by :func:`repdiag.common.images.read_rgb`: regular files only, square
    and of the first image's size (checked from each header, before decoding), at most
    :data:`FOLDER_MAX_PIXELS` each and :data:`SPLIT_MAX_PIXELS` in all, converted by mode
    (16-bit grey scaled)."""
    paths, labels = _list_folder_split(split_dir, classes)
    keep = balanced_subset(labels, n)
    options = ReadOptions(root=split_dir, max_pixels=FOLDER_MAX_PIXELS, max_aspect=1.0)
    images, pixels = [], 0
    for index in keep:
        try:
            images.append(read_rgb_array(paths[index], options))
        except ImageError as err:  # the message names the file and what to do
            raise StoreError(f"{err} (CIFAR folder {split_dir})") from err
        if options.shape is None:
            options = dataclasses.replace(options, shape=images[0].shape[1::-1])
        pixels += images[-1].shape[0] * images[-1].shape[1]
        if pixels > SPLIT_MAX_PIXELS:
            raise StoreError(
                f"{split_dir}: the {len(keep)} images kept hold more than {SPLIT_MAX_PIXELS} "
                "pixels; set cifar.n_train / cifar.n_test lower or use smaller images"
            )
    return Split(np.stack(images), labels[keep])


def _read_folder_layout(
    root: Path, n_train: int | None = None, n_test: int | None = None
) -> tuple[Split, Split, tuple[str, ...]]:
    classes = tuple(sorted(p.name for p in (root / "train").iterdir() if p.is_dir()))
    if len(classes) < 2:
        raise StoreError(f"{root / 'train'} must have one sub-folder per class (found {classes})")
    return (
        _read_folder_split(root / "train", classes, n_train),
        _read_folder_split(root / "test", classes, n_test),
        classes,
    )


def balanced_subset(labels: np.ndarray, n: int | None) -> np.ndarray:
    """Indices of the first ``n`` images taken round-robin over the classes (all when ``n`` is None).

    Deterministic and class-balanced: the k-th image of every class comes before the (k+1)-th of
    any class; within a round, classes are in label order; indices come back sorted.
    """
    if n is None or n >= len(labels):
        return np.arange(len(labels))
    rank_in_class = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rank_in_class[members] = np.arange(len(members))
    order = np.lexsort((labels, rank_in_class))
    return np.sort(order[:n])


def _subset(split: Split, n: int | None) -> Split:
    keep = balanced_subset(split.labels, n)
    return Split(split.images[keep], split.labels[keep])


def load_cifar10(
    data_dir: str | Path | None,
    layout: str = "auto",
    n_train: int | None = None,
    n_test: int | None = None,
) -> CifarData:
    """CIFAR-10 from ``data_dir`` (either layout), optionally a class-balanced subset per split."""
    found, root = locate(data_dir, layout)
    if found == "pickle":
        train, test, classes = _read_pickle_layout(root)
    else:  # the subsets chosen from the listing, so only the kept images are decoded
        train, test, classes = _read_folder_layout(root, n_train, n_test)
    for name, split in (("train", train), ("test", test)):
        if split.labels.min() < 0 or split.labels.max() >= len(classes):
            raise StoreError(
                f"{root}: {name} labels must be in [0, {len(classes)}), found "
                f"[{split.labels.min()}, {split.labels.max()}]"
            )
    if train.images.shape[1:] != test.images.shape[1:]:
        raise StoreError(
            f"{root}: train images are {train.images.shape[1:]}, test images "
            f"{test.images.shape[1:]}; both splits must have one image size"
        )
    data = CifarData(_subset(train, n_train), _subset(test, n_test), classes, root, found)
    log.info(
        "CIFAR (%s layout) from %s: %d train, %d test images of %d px, %d classes",
        found,
        root,
        len(data.train),
        len(data.test),
        data.image_size,
        len(classes),
    )
    return data


def download_cifar10(
    data_dir: str | Path, url: str = CIFAR10_URL, md5: str | None = CIFAR10_MD5
) -> Path:
    """Fetch the python version, check its MD5, extract ``cifar-10-batches-py`` into ``data_dir``.

    The archive is extracted beside the target and renamed into place only when complete.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    archive_path = data_dir / "cifar-10-python.tar.gz"
    with atomic_path(archive_path) as archive:
        log.info("downloading %s", url)
        with urllib.request.urlopen(url) as response, open(archive, "wb") as out:
            shutil.copyfileobj(response, out)
        digest = hashlib.md5(archive.read_bytes()).hexdigest()
        if md5 is not None and digest != md5:
            raise StoreError(f"{url}: MD5 {digest} differs from the published {md5}; retry")
    with (
        atomic_path(data_dir / BATCH_DIR) as tmp,
        tempfile.TemporaryDirectory(dir=data_dir, prefix=".extract-") as scratch,
    ):
        with tarfile.open(archive_path) as tar:
            tar.extractall(scratch, filter="data")  # refuses absolute paths, links out, devices
        inner = Path(scratch) / BATCH_DIR
        if not inner.is_dir():
            raise StoreError(f"{url}: the archive has no {BATCH_DIR}/ folder")
        inner.rename(tmp)
    locate(data_dir, "pickle")
    return data_dir / BATCH_DIR


def synthetic_images(
    n_per_class: int, n_classes: int = 10, image_size: int = 32, seed: int = 0
) -> Split:
    """Class-structured RGB images: per class an oriented grating in a class colour, plus noise.

    A stand-in for CIFAR-10 in tests and smoke runs (no real data is needed), learnable by all
    three encoders and invariant in class under crops, flips and colour changes of moderate size.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:image_size, 0:image_size] / image_size
    images, labels = [], []
    for c in range(n_classes):
        angle = np.pi * c / n_classes
        colour = 0.25 + 0.5 * np.abs(np.sin(np.pi * (c / n_classes + np.arange(3) / 3)))
        for _ in range(n_per_class):
            phase = rng.uniform(0, 2 * np.pi)
            wave = np.sin(2 * np.pi * 3 * (np.cos(angle) * x + np.sin(angle) * y) + phase)
            image = colour * (0.6 + 0.4 * wave[..., None]) + rng.normal(0, 0.05, (*x.shape, 3))
            images.append(np.clip(np.rint(255 * image), 0, 255).astype(np.uint8))
            labels.append(c)
    order = rng.permutation(len(labels))
    return Split(np.stack(images)[order], np.asarray(labels, dtype=np.int64)[order])


def _write_pickle(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as stream:
        pickle.dump(obj, stream, protocol=4)


def write_fixture(
    data_dir: str | Path,
    layout: str = "pickle",
    n_train_per_class: int = 10,
    n_test_per_class: int = 4,
    n_classes: int = 10,
    image_size: int = 32,
    seed: int = 0,
) -> Path:
    """Write :func:`synthetic_images` in a CIFAR-10 layout (``pickle`` or ``folder``) under ``data_dir``."""
    data_dir = Path(data_dir)
    train = synthetic_images(n_train_per_class, n_classes, image_size, seed)
    test = synthetic_images(n_test_per_class, n_classes, image_size, seed + 1)
    classes = [f"class{c}" for c in range(n_classes)]
    if n_classes == len(CIFAR10_CLASSES):
        classes = list(CIFAR10_CLASSES)
    if layout == "pickle":
        root = data_dir / BATCH_DIR
        root.mkdir(parents=True, exist_ok=True)

        def batch(split: Split, rows: np.ndarray, label: str) -> dict[str, Any]:
            flat = split.images[rows].transpose(0, 3, 1, 2).reshape(len(rows), -1)
            return {
                "batch_label": label,
                "labels": [int(v) for v in split.labels[rows]],
                "data": np.ascontiguousarray(flat),
                "filenames": [f"{label}_{i:05d}.png" for i in rows],
            }

        for i, rows in enumerate(np.array_split(np.arange(len(train)), len(TRAIN_BATCHES))):
            _write_pickle(root / TRAIN_BATCHES[i], batch(train, rows, f"training batch {i + 1}"))
        _write_pickle(root / TEST_BATCH, batch(test, np.arange(len(test)), "testing batch 1"))
        _write_pickle(root / META_FILE, {"label_names": classes, "num_vis": 3 * image_size**2})
        return root
    if layout == "folder":
        from PIL import Image

        for split_name, split in (("train", train), ("test", test)):
            for i, (image, label) in enumerate(zip(split.images, split.labels, strict=True)):
                folder = data_dir / split_name / classes[label]
                with atomic_path(folder / f"{i:05d}.png") as tmp:
                    Image.fromarray(image).save(tmp, format="PNG")
        return data_dir
    raise ConfigError(f"fixture layout must be 'pickle' or 'folder', got {layout!r}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m repdiag.cifar.data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="fetch and extract the official python version")
    down.add_argument("data_dir")
    fix = sub.add_parser("fixture", help="write a small synthetic stand-in in CIFAR format")
    fix.add_argument("data_dir")
    fix.add_argument("--layout", choices=("pickle", "folder"), default="pickle")
    fix.add_argument("--train-per-class", type=int, default=10)
    fix.add_argument("--test-per-class", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "download":
        print(download_cifar10(args.data_dir))
    else:
        print(write_fixture(args.data_dir, args.layout, args.train_per_class, args.test_per_class))


if __name__ == "__main__":
    main()
