"""CIFAR-10 loader: both layouts on generated fixtures, the restricted unpickler, clear errors."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from repdiag.cifar import data as cifar
from repdiag.core.errors import ConfigError, StoreError


def _official_batch(images: np.ndarray, labels: list[int]) -> dict:
    """A batch dict as in the official files: channel-major rows of 3 * 32 * 32 uint8 values."""
    return {
        "batch_label": "training batch",
        "labels": labels,
        "data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
        "filenames": [f"im{i}.png" for i in range(len(images))],
    }


def test_pickle_layout_round_trips_pixels_labels_and_class_names(tmp_path: Path) -> None:
    root = cifar.write_fixture(tmp_path, "pickle", n_train_per_class=3, n_test_per_class=2)
    assert root == tmp_path / cifar.BATCH_DIR
    expected = cifar.synthetic_images(3, 10, 32, seed=0)
    data = cifar.load_cifar10(tmp_path)
    assert data.layout == "pickle" and data.classes == cifar.CIFAR10_CLASSES
    assert data.train.images.shape == (30, 32, 32, 3) and data.train.images.dtype == np.uint8
    np.testing.assert_array_equal(data.train.images, expected.images)
    np.testing.assert_array_equal(data.train.labels, expected.labels)
    assert len(data.test) == 20 and data.image_size == 32
    # the batches directory itself is accepted too
    np.testing.assert_array_equal(cifar.load_cifar10(root).test.images, data.test.images)


def test_channel_major_rows_become_hwc_images(tmp_path: Path) -> None:
    """Row layout of the official files: 1024 red, 1024 green, 1024 blue values, row-major."""
    image = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    image[0, 1, 2] = (10, 20, 30)  # pixel at row 1, column 2
    batch = _official_batch(image, [7])
    flat = batch["data"][0]
    assert (flat[32 + 2], flat[1024 + 32 + 2], flat[2048 + 32 + 2]) == (10, 20, 30)
    for name in (*cifar.TRAIN_BATCHES, cifar.TEST_BATCH):
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=4))
    data = cifar.load_cifar10(tmp_path)
    assert tuple(data.test.images[0, 1, 2]) == (10, 20, 30) and data.test.labels[0] == 7
    assert data.classes == cifar.CIFAR10_CLASSES  # no batches.meta: the standard names


def test_folder_layout_reads_the_same_images(tmp_path: Path) -> None:
    cifar.write_fixture(tmp_path / "p", "pickle", n_train_per_class=2, n_test_per_class=1)
    cifar.write_fixture(tmp_path / "f", "folder", n_train_per_class=2, n_test_per_class=1)
    from_pickle, from_folder = (
        cifar.load_cifar10(tmp_path / "p"),
        cifar.load_cifar10(tmp_path / "f"),
    )
    assert from_folder.layout == "folder"
    assert from_folder.classes == tuple(sorted(cifar.CIFAR10_CLASSES))

    def as_set(data: cifar.CifarData) -> set[tuple[str, bytes]]:
        return {
            (data.classes[y], im.tobytes())
            for im, y in zip(data.train.images, data.train.labels, strict=True)
        }

    assert as_set(from_folder) == as_set(from_pickle)  # PNG is lossless; order differs


def test_protocol_2_pickles_with_codecs_encode_are_read(tmp_path: Path) -> None:
    """Protocol-2 pickles written by Python 3 store bytes through ``_codecs.encode``."""
    split = cifar.synthetic_images(1, 10, 32, seed=3)
    batch = _official_batch(split.images, split.labels.tolist())
    payload = pickle.dumps(batch, protocol=2)
    assert b"_codecs" in payload
    path = tmp_path / "batch"
    path.write_bytes(payload)
    np.testing.assert_array_equal(cifar.read_pickle_batch(path)["data"], batch["data"])


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_other_globals(tmp_path: Path) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": _Evil()}))
    with pytest.raises(StoreError, match=r"refusing to unpickle .*system"):
        cifar.read_pickle_batch(path)
    with pytest.raises(StoreError, match="refusing"):
        cifar.NumpyOnlyUnpickler(io.BytesIO(pickle.dumps(np.float32)), path).load()


def test_corrupt_batch_names_the_file(tmp_path: Path) -> None:
    cifar.write_fixture(tmp_path, "pickle", n_train_per_class=1, n_test_per_class=1)
    bad = tmp_path / cifar.BATCH_DIR / "data_batch_3"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(StoreError, match="data_batch_3"):
        cifar.load_cifar10(tmp_path)


def test_missing_directory_says_where_to_put_the_data(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as err:
        cifar.load_cifar10(missing)
    message = str(err.value)
    for part in (
        str(missing),
        "cifar.data_dir",
        "cifar-10-batches-py/data_batch_1",
        "https://www.cs.toronto.edu/~kriz/cifar.html",
        "python -m repdiag.cifar.data download",
        "train/<class>/*.png",
    ):
        assert part in message, part
    with pytest.raises(ConfigError, match=r"cifar\.data_dir is not set"):
        cifar.locate(None)
    # a half-present pickle layout (no test batch) is not accepted either
    cifar.write_fixture(tmp_path / "half", "pickle", n_train_per_class=1, n_test_per_class=1)
    (tmp_path / "half" / cifar.BATCH_DIR / cifar.TEST_BATCH).unlink()
    with pytest.raises(ConfigError, match="not found"):
        cifar.locate(tmp_path / "half", "pickle")


def test_balanced_subset_takes_classes_round_robin() -> None:
    labels = np.array([0, 0, 0, 1, 2, 2, 1, 0])
    np.testing.assert_array_equal(cifar.balanced_subset(labels, 3), [0, 3, 4])
    # round 2 goes class 0 (index 1), then class 1 (index 6) before class 2 (index 5)
    np.testing.assert_array_equal(cifar.balanced_subset(labels, 5), [0, 1, 3, 4, 6])
    np.testing.assert_array_equal(cifar.balanced_subset(labels, None), np.arange(8))
    data_labels = cifar.synthetic_images(5, 10, 8).labels
    counts = np.bincount(data_labels[cifar.balanced_subset(data_labels, 20)], minlength=10)
    np.testing.assert_array_equal(counts, np.full(10, 2))


def test_download_verifies_md5_and_extracts(tmp_path: Path) -> None:
    """The download path on a local file:// archive (no network in tests)."""
    src = tmp_path / "src"
    cifar.write_fixture(src, "pickle", n_train_per_class=1, n_test_per_class=1)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / cifar.BATCH_DIR, arcname=cifar.BATCH_DIR)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    with pytest.raises(StoreError, match="MD5"):
        cifar.download_cifar10(tmp_path / "bad", url=archive.as_uri(), md5="0" * 32)
    assert not (tmp_path / "bad" / cifar.BATCH_DIR).exists()
    root = cifar.download_cifar10(tmp_path / "dest", url=archive.as_uri(), md5=md5)
    assert root == tmp_path / "dest" / cifar.BATCH_DIR
    assert len(cifar.load_cifar10(tmp_path / "dest").train) == 10


def test_a_folder_decodes_only_the_subset_it_keeps_and_caps_a_split(tmp_path, monkeypatch):
    """Before: every image of a folder was decoded and stacked, then n_train applied (402
    constant 1024 x 1024 PNGs: 2.5 GB for 10 kept). Now the class-balanced subset is chosen from
    the listing and only it is decoded; a split's decoded pixels are capped."""
    from PIL import Image

    from repdiag.common.images import DECODED

    root = tmp_path / "big"
    cifar.write_fixture(root, "folder", n_train_per_class=1, n_test_per_class=1, n_classes=2)
    big = Image.new("RGB", (512, 512), (9, 9, 9))  # constant: a few KB on disk
    for split, count in (("train", 20), ("test", 6)):
        for label in (0, 1):
            folder = root / split / f"class{label}"
            for old in folder.glob("*.png"):
                old.unlink()
            for i in range(count):
                big.save(folder / f"{i:03d}.png")
    DECODED.reset()
    data = cifar.load_cifar10(root, n_train=4, n_test=2)
    assert (len(data.train), len(data.test)) == (4, 2)
    assert list(data.train.labels) == [0, 0, 1, 1]  # two per class, in file order, as before
    assert DECODED.files == 6 and DECODED.pixels == 6 * 512 * 512  # not 52 images
    monkeypatch.setattr(cifar, "SPLIT_MAX_PIXELS", 3 * 512 * 512)
    with pytest.raises(
        cifar.StoreError,
        match=r"the 4 images kept hold more than 786432 pixels; set cifar\.n_train",
    ):
        cifar.load_cifar10(root, n_train=4, n_test=2)
    monkeypatch.setattr(cifar, "FOLDER_MAX_FILES", 30)
    with pytest.raises(cifar.StoreError, match=r"train lists more than 30 image files"):
        cifar.load_cifar10(root, n_train=4, n_test=2)
