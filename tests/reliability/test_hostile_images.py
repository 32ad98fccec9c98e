"""Images decoded by the one reader (issue "one image reader"): a 20000 x 1 PNG, FIFOs named like
images, CIFAR folders with 16-bit and 12000 x 12000 PNGs, a probe folder of which two images are
kept, CIFAR batches whose arrays claim bytes they do not hold. Each goes through the library entry
point its workflow script calls; resource cases run in a subprocess that reports its own peak
memory and the pixels decoded (:data:`repdiag.common.images.DECODED`), never a time."""

from __future__ import annotations

import os
import pickle
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from repdiag.cifar.data import load_cifar10, write_fixture
from repdiag.core.errors import ConfigError, StoreError
from tests.reliability.memory import run_measured

PRELOADED = (
    "torch",
    "repdiag.encoders.preprocess",
    "repdiag.binding.jacobian_stage",
    "repdiag.cifar.data",
    "repdiag.sugarcrepe.data",
)
"""Imported before the baseline: a case's memory is its peak minus the imports' (torch alone
is some 400 MiB)."""
GROWTH_MIB = 100


def _run(code: str) -> dict:
    """Run ``code`` (which fills ``result``) in a fresh interpreter: its result, peak RSS (MiB)
    before and after ``code`` (modules of :data:`PRELOADED` imported first) and the pixels the
    image reader decoded."""
    prelude = (
        "from repdiag.common.images import DECODED\n"
        f"import {', '.join(PRELOADED)}\n"
        "before = peak_mib()\n"
    )
    code = textwrap.dedent(code) + (
        "\nresult.update(pixels=DECODED.pixels, files=DECODED.files, before_mib=before)\n"
    )
    return run_measured(code, prelude)


def _tiny_png(path: Path, width: int, height: int) -> Path:
    """A grey PNG of ``width`` x ``height`` written by hand (zlib-compressed zero rows): a few
    hundred bytes whatever its size, so the test never holds the pixels itself."""
    import struct

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    compressor = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )
    return path


def test_a_20000_x_1_png_is_refused_from_its_header_on_both_paths(tmp_path):
    """Before: 4.9 GB in load_image_folder and 5.2 GB on the SugarCrepe path (resized to
    4.48 M x 224 before cropping)."""
    path = _tiny_png(tmp_path / "images" / "strip.png", 20000, 1)
    assert path.stat().st_size < 300
    result = _run(
        f"""
        from repdiag.encoders.preprocess import load_image_folder
        from repdiag.sugarcrepe.data import open_rgb
        result["errors"] = []
        for read in (lambda: load_image_folder({str(path.parent)!r}, 224), lambda: open_rgb({str(path)!r})):
            try:
                read()
            except ValueError as err:
                result["errors"].append(str(err))
        """
    )
    assert len(result["errors"]) == 2
    for message in result["errors"]:
        assert "strip.png is 20000 x 1: its sides differ by more than 50 times" in message
    assert result["pixels"] == 0 and result["peak_mib"] - result["before_mib"] < GROWTH_MIB


def test_a_long_image_within_the_ratio_is_cropped_before_it_is_resized(tmp_path):
    _tiny_png(tmp_path / "images" / "long.png", 5000, 100)
    result = _run(
        f"""
        from repdiag.encoders.preprocess import load_image_folder
        ids, images = load_image_folder({str(tmp_path / "images")!r}, 224)
        result["shape"] = list(images.shape)
        """
    )
    assert result["shape"] == [1, 224, 224, 3]
    assert result["pixels"] == 5000 * 100 and result["files"] == 1
    assert result["peak_mib"] - result["before_mib"] < GROWTH_MIB  # not 11200 x 224 pixels


def _fifo_case(folder: Path) -> Path:
    os.mkfifo(folder / "b.png")
    return folder / "b.png"


def test_a_fifo_named_like_an_image_is_refused_naming_it(tmp_path):
    """Before: the job hung forever with no message (image folder and CIFAR class folder)."""
    images = tmp_path / "images"
    _tiny_png(images / "a.png", 8, 8)
    _fifo_case(images)
    cifar = tmp_path / "cifar"
    write_fixture(cifar, "folder", n_train_per_class=1, n_test_per_class=1, n_classes=2)
    _fifo_case(cifar / "train" / "class0")
    result = _run(
        f"""
        from repdiag.cifar.data import load_cifar10
        from repdiag.encoders.preprocess import load_image_folder
        result["errors"] = []
        for read in (lambda: load_image_folder({str(images)!r}, 16), lambda: load_cifar10({str(cifar)!r})):
            try:
                read()
            except (ValueError, OSError) as err:
                result["errors"].append(str(err))
        """
    )
    assert len(result["errors"]) == 2
    for message in result["errors"]:
        assert "b.png is not a regular file (a FIFO)" in message
        assert "square" not in message  # no hint that does not apply (a size hint was appended)


def test_cifar_folders_read_16_bit_pngs_by_mode(tmp_path):
    """Before: 5 distinct values, nearly all white (PIL's convert clips 16-bit to 0..255)."""
    root = tmp_path / "cifar"
    write_fixture(root, "folder", n_train_per_class=1, n_test_per_class=1, n_classes=2)
    ramp = (np.arange(1024, dtype=np.uint16) * 64).reshape(32, 32)
    for split in ("train", "test"):
        for path in (root / split / "class0").glob("*.png"):
            Image.fromarray(ramp).save(path)
    data = load_cifar10(root)
    grey = data.train.images[data.train.labels == 0][0]
    np.testing.assert_array_equal(grey[..., 0], np.round(ramp / 65535 * 255).astype(np.uint8))
    assert len(np.unique(grey)) == 256


def test_a_12000_x_12000_png_in_a_cifar_folder_is_refused_before_decoding(tmp_path):
    """Before: 1.65 GB spent on a 140 KB file before it was refused."""
    root = tmp_path / "cifar"
    write_fixture(root, "folder", n_train_per_class=1, n_test_per_class=1, n_classes=2)
    big = _tiny_png(root / "train" / "class1" / "zz.png", 12000, 12000)
    assert big.stat().st_size < 200_000
    result = _run(
        f"""
        from repdiag.cifar.data import load_cifar10
        try:
            load_cifar10({str(root)!r})
        except OSError as err:
            result["error"] = str(err)
        """
    )
    assert (
        "zz.png is 12000 x 12000 = 144000000 pixels, over the budget of 1048576"
        in (result["error"])
    )
    # the CIFAR folder's limit is its own: the variable that sets the default would not help
    assert "REPDIAG_MAX_IMAGE_PIXELS" not in result["error"]
    assert result["pixels"] <= 2 * 32 * 32
    assert result["peak_mib"] - result["before_mib"] < GROWTH_MIB


def test_a_probe_folder_decodes_only_the_images_it_keeps(tmp_path):
    """Before: all 4000 images of the folder decoded and resized to keep 2."""
    folder = tmp_path / "probes"
    for i in range(400):
        _tiny_png(folder / f"{i:04d}.png", 64, 48)
    result = _run(
        f"""
        from repdiag.binding.jacobian_stage import load_probes
        from repdiag.encoders.preprocess import Preprocess
        probes = load_probes({{"folder": {{"path": {str(folder)!r}, "n": 2}}}}, Preprocess(16),
                             seed=0)
        result["ids"] = list(probes.ids)
        result["shape"] = list(probes.x.shape)
        """
    )
    assert result["ids"] == ["folder/0000.png", "folder/0001.png"]
    assert result["shape"] == [2, 3, 16, 16]
    assert result["files"] == 2 and result["pixels"] == 2 * 64 * 48
    assert result["peak_mib"] - result["before_mib"] < GROWTH_MIB


def test_an_image_folder_of_more_files_than_its_cap_is_refused_before_decoding(
    tmp_path, monkeypatch
):
    """Issue 60, class 2: 15,000 1 x 1 PNGs (1 MB) were upsampled and kept (2.7 GB). The cap
    (20,000 at 2.8 GiB) is lowered to 5 here so that six files exercise it."""
    from repdiag.common.images import DECODED
    from repdiag.core.errors import EncoderError
    from repdiag.encoders import preprocess

    folder = tmp_path / "natural"
    for i in range(6):
        _tiny_png(folder / f"{i}.png", 1, 1)
    monkeypatch.setattr(preprocess, "FOLDER_MAX_IMAGES", 5)
    DECODED.reset()
    with pytest.raises(EncoderError, match=r"holds 6 images, over 5 .*embeddings\.folder"):
        preprocess.load_image_folder(folder, 224)
    assert DECODED.files == 0
    ids, images = preprocess.load_image_folder(folder, 8, limit=5)  # a limit within the cap
    assert len(ids) == 5 and images.shape == (5, 8, 8, 3)


class _ClaimsMore:
    """numpy's own array recipe with a shape far larger than the bytes it carries."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __reduce__(self):
        rebuild = np.ndarray.__reduce__(np.zeros(0))[0]
        return (
            rebuild,
            (np.ndarray, (0,), b"b"),
            (1, (self.rows, 3072), np.dtype("u1"), False, b""),
        )


def test_cifar_batches_whose_arrays_claim_bytes_they_lack_are_refused(tmp_path):
    """Before: 131-byte batches became 3.1 GB of unfilled (N, 3072) arrays, accepted with valid
    labels, different pixels on every load."""
    root = tmp_path / "cifar"
    batches = write_fixture(root, "pickle", n_train_per_class=1, n_test_per_class=1)
    victim = batches / "data_batch_1"
    victim.write_bytes(pickle.dumps({"data": _ClaimsMore(100_000), "labels": [0] * 100_000}))
    result = _run(
        f"""
        from repdiag.cifar.data import load_cifar10
        try:
            load_cifar10({str(root)!r})
        except OSError as err:
            result["error"] = str(err)
        """
    )
    assert "data_batch_1: refusing an array that claims shape (100000, 3072)" in result["error"]
    assert result["peak_mib"] - result["before_mib"] < GROWTH_MIB
    with pytest.raises(StoreError, match=r"claims shape \(100000, 3072\)"):
        load_cifar10(root)


def test_sugarcrepe_file_names_that_leave_the_image_folder_are_refused(tmp_path):
    from repdiag.sugarcrepe.data import check_images

    (tmp_path / "images").mkdir()
    _tiny_png(tmp_path / "secret.png", 8, 8)
    with pytest.raises(ConfigError, match=r"lead outside .*images, e\.g\. \['\.\./secret\.png'\]"):
        check_images(tmp_path / "images", ["../secret.png"])
