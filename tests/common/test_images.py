"""The one image reader: regular files inside the tree, header checks before decoding, crop
before resize, conversion by mode, and a count of what was decoded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from repdiag.common import images
from repdiag.common.images import (
    DECODED,
    MAX_JPEG_SCANS,
    ImageError,
    ReadOptions,
    list_images,
    max_image_pixels,
    mode_cost,
    read_rgb,
    read_rgb_array,
)


def _png(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(path)
    return path


def test_a_fifo_is_refused_at_once_naming_the_file(tmp_path):
    fifo = tmp_path / "b.png"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match=r"b\.png is not a regular file \(a FIFO\)"):
        read_rgb(fifo)


def test_a_link_out_of_the_tree_is_refused_and_one_inside_is_read(tmp_path):
    outside = _png(tmp_path / "outside" / "x.png", np.full((4, 4, 3), 7, np.uint8))
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "out.png").symlink_to(outside)
    with pytest.raises(ImageError, match=r"out\.png is a symbolic link to .*outside"):
        read_rgb(folder / "out.png")
    inside = _png(folder / "sub" / "y.png", np.full((4, 4, 3), 9, np.uint8))
    (folder / "in.png").symlink_to(inside)
    assert read_rgb_array(folder / "in.png", ReadOptions(root=folder)).max() == 9


def test_pixel_budget_aspect_and_shape_are_checked_before_decoding(tmp_path):
    path = _png(tmp_path / "wide.png", np.zeros((1, 2000, 3), np.uint8))
    DECODED.reset()
    with pytest.raises(ImageError, match=r"wide\.png is 2000 x 1: its sides differ by more than"):
        read_rgb(path)
    with pytest.raises(
        ImageError,
        match=r"2000 x 1 = 2000 pixels, over the budget of 1000; shrink it or remove it from the folder$",
    ):
        read_rgb(path, ReadOptions(max_pixels=1000))  # a reader's own limit: no variable named
    with pytest.raises(ImageError, match=r"the other images of its set are 4 x 4"):
        read_rgb(path, ReadOptions(max_aspect=1e9, shape=(4, 4)))
    assert DECODED.pixels == 0 and DECODED.files == 0


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", "123")
    assert max_image_pixels() == 123
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", "many")
    with pytest.raises(ImageError, match="REPDIAG_MAX_IMAGE_PIXELS='many'"):
        max_image_pixels()


def test_the_centre_square_is_resampled_before_any_resize(tmp_path):
    """A 40 x 10 image, white in its centre 20 columns (the centre square and the 4 source
    pixels either side that bicubic reads at scale 2), black outside: resampled to 5 x 5 it is
    white everywhere (resizing first would give 20 x 5, then the crop), 400 pixels decoded."""
    array = np.zeros((10, 40, 3), np.uint8)
    array[:, 10:30] = 255
    path = _png(tmp_path / "strip.png", array)
    DECODED.reset()
    out = read_rgb_array(path, ReadOptions(size=5))
    assert out.shape == (5, 5, 3) and out.min() >= 250
    assert DECODED.files == 1 and DECODED.pixels == 400
    square = read_rgb_array(path, ReadOptions(square=True))
    assert square.shape == (10, 10, 3) and square.min() == 255
    np.testing.assert_array_equal(square, array[:, 15:25])


def test_16_bit_grey_and_palette_images_are_converted_by_mode(tmp_path):
    ramp = (np.arange(64, dtype=np.uint16) * 1040).reshape(8, 8)
    grey = read_rgb_array(_png(tmp_path / "g16.png", ramp))
    expected = np.round(ramp / 65535 * 255).astype(np.uint8)
    np.testing.assert_array_equal(grey[..., 0], expected)
    assert len(np.unique(grey)) == 64
    palette = Image.new("P", (4, 4))
    palette.putpalette([10, 20, 30] + [0, 0, 0] * 255)
    palette.save(tmp_path / "p.png")
    np.testing.assert_array_equal(read_rgb_array(tmp_path / "p.png")[0, 0], [10, 20, 30])


def test_a_corrupt_file_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(ImageError, match=r"cannot read image \S*bad\.png"):
        read_rgb(bad)


def test_list_images_is_sorted_recursive_and_does_not_follow_folder_links(tmp_path):
    _png(tmp_path / "d" / "b.PNG", np.zeros((2, 2, 3), np.uint8))
    _png(tmp_path / "d" / "a" / "c.jpg", np.zeros((2, 2, 3), np.uint8))
    (tmp_path / "d" / "notes.txt").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    _png(tmp_path / "elsewhere" / "z.png", np.zeros((2, 2, 3), np.uint8))
    (tmp_path / "d" / "link").symlink_to(tmp_path / "elsewhere")
    names = [
        p.relative_to(tmp_path / "d").as_posix()
        for p in list_images(tmp_path / "d", (".png", ".jpg"))
    ]
    assert names == ["a/c.jpg", "b.PNG"]
    assert [p.name for p in list_images(tmp_path / "d", (".png",), recursive=False)] == ["b.PNG"]


def test_the_default_budget_names_the_variable_that_raises_it(tmp_path, monkeypatch):
    path = _png(tmp_path / "big.png", np.zeros((40, 40, 3), np.uint8))
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(
        ImageError,
        match=r"over the budget of 1000; shrink it, remove it from the folder or raise REPDIAG_MAX_IMAGE_PIXELS",
    ):
        read_rgb(path)


def test_deep_pixels_are_charged_by_their_memory_and_converted_in_blocks(tmp_path, monkeypatch):
    """Issue 60: 16-bit and float images took 7x the memory of 8-bit ones under one budget."""
    assert (mode_cost("RGB"), mode_cost("L"), mode_cost("I;16"), mode_cost("F")) == (1, 1, 2, 3)
    ramp = (np.arange(64 * 64, dtype=np.uint16) * 16).reshape(64, 64)
    deep = _png(tmp_path / "g16.png", ramp)
    flat = _png(tmp_path / "g8.png", (ramp >> 8).astype(np.uint8))
    budget = ReadOptions(max_pixels=64 * 64 + 1)
    read_rgb(flat, budget)
    with pytest.raises(ImageError, match=r"4096 pixels \(x2: I;16 pixels take 2 times"):
        read_rgb(deep, budget)
    monkeypatch.setattr(images, "CONVERT_BLOCK", 100)  # rows of 64: one block is one row
    blocked = read_rgb_array(deep)
    np.testing.assert_array_equal(blocked[..., 0], np.round(ramp / 65535 * 255).astype(np.uint8))
    values = np.linspace(-3, 5, 64 * 64, dtype=np.float32).reshape(64, 64)
    values[0, 0] = np.nan
    Image.fromarray(values, "F").save(tmp_path / "f.tiff")
    grey = read_rgb_array(tmp_path / "f.tiff")[..., 0].astype(float)
    wide = values.astype(np.float64)
    scaled = np.nan_to_num((wide - np.nanmin(wide)) / (np.nanmax(wide) - np.nanmin(wide)))
    np.testing.assert_array_equal(grey, np.round(scaled * 255))


def _progressive(path: Path, repeats: int) -> Path:
    """A progressive JPEG whose last scan is repeated ``repeats`` more times before its end."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(path, progressive=True)
    data = path.read_bytes()
    last = data.rindex(b"\xff\xda")
    path.write_bytes(data[:last] + data[last:-2] * (1 + repeats) + data[-2:])
    return path


def test_a_jpeg_of_too_many_scans_is_refused_before_decoding(tmp_path):
    """Issue 60: one scan repeated 15,000 times (1.3 MB) took 55 s to decode under the budget."""
    plain = _progressive(tmp_path / "plain.jpg", 0)
    assert 2 <= plain.read_bytes().count(b"\xff\xda") <= MAX_JPEG_SCANS
    assert read_rgb_array(plain).shape == (32, 32, 3)
    DECODED.reset()
    with pytest.raises(ImageError, match=f"more than {MAX_JPEG_SCANS} scans"):
        read_rgb(_progressive(tmp_path / "bomb.jpg", 200))
    assert DECODED.files == 0


def test_a_hard_linked_image_is_refused_naming_it(tmp_path):
    """Issue 60, class 3: a hard link passed where a symbolic link out of the folder is refused."""
    outside = _png(tmp_path / "outside" / "secret.png", np.zeros((4, 4, 3), np.uint8))
    folder = tmp_path / "images"
    folder.mkdir()
    os.link(outside, folder / "a.png")
    with pytest.raises(ImageError, match=r"a\.png is a hard link \(2 names\)"):
        read_rgb(folder / "a.png", ReadOptions(root=folder))
    (folder / "a.png").unlink()  # one name again: read
    os.link(outside, folder / "b.png")
    outside.unlink()
    assert read_rgb_array(folder / "b.png", ReadOptions(root=folder)).shape == (4, 4, 3)
