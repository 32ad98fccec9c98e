"""Bitwise comparison of workflow outputs, ignoring only what records time.

Stores: every array's dtype, shape and bytes, and the attributes; JSON: every value; safetensors:
every tensor's dtype, shape and bytes; other files: their bytes. Keys that hold a duration, a
rate or a creation time (see ``VOLATILE``) are the only things left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import zarr

VOLATILE = re.compile(r"(^created$|time_s$|per_s$|seconds)")


def strip_volatile(value: Any) -> Any:
    """``value`` without the dict keys that record wall time, rates or creation time."""
    if isinstance(value, dict):
        return {k: strip_volatile(v) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [strip_volatile(v) for v in value]
    return value


def _same_array(name: str, a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.kind in "OUS":
        assert a.tolist() == b.tolist(), name
        return
    if a.tobytes() != b.tobytes():
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        raise AssertionError(
            f"{name}: {int(np.count_nonzero(diff))} of {a.size} values differ "
            f"(max abs difference {diff.max():.3g})"
        )


def assert_same_arrays(ref: Path, new: Path) -> None:
    """The two stores hold the same array names, each with the same dtype, shape and bytes."""
    ref_arrays = dict(zarr.open_group(ref, mode="r").arrays())
    new_arrays = dict(zarr.open_group(new, mode="r").arrays())
    assert sorted(ref_arrays) == sorted(new_arrays), (ref, sorted(ref_arrays), sorted(new_arrays))
    for name, array in ref_arrays.items():
        _same_array(f"{new}/{name}", array[...], new_arrays[name][...])


def assert_same_store(ref: Path, new: Path) -> None:
    """:func:`assert_same_arrays`, and the same group and array attributes (times left out)."""
    assert_same_arrays(ref, new)
    ref_group, new_group = zarr.open_group(ref, mode="r"), zarr.open_group(new, mode="r")
    for name, array in ref_group.arrays():
        assert strip_volatile(dict(array.attrs)) == strip_volatile(dict(new_group[name].attrs))
    assert strip_volatile(dict(ref_group.attrs)) == strip_volatile(dict(new_group.attrs)), new


def assert_same_safetensors(ref: Path, new: Path) -> None:
    from safetensors.numpy import load_file

    ref_tensors, new_tensors = load_file(ref), load_file(new)
    assert sorted(ref_tensors) == sorted(new_tensors), new
    for name, tensor in ref_tensors.items():
        _same_array(f"{new}:{name}", tensor, new_tensors[name])


def assert_same_output(ref: Path, new: Path) -> None:
    """Fail with the first difference between two outputs (files, stores or folders)."""
    assert new.exists(), f"{new} is missing"
    if ref.suffix == ".zarr":
        assert_same_store(ref, new)
    elif ref.is_dir():  # entry by entry, so that a store inside is compared as a store
        ref_names = sorted(p.name for p in ref.iterdir())
        new_names = sorted(p.name for p in new.iterdir())
        assert ref_names == new_names, (new, ref_names, new_names)
        for name in ref_names:
            assert_same_output(ref / name, new / name)
    elif ref.suffix == ".json":
        ref_data, new_data = json.loads(ref.read_text()), json.loads(new.read_text())
        assert strip_volatile(ref_data) == strip_volatile(new_data), new
    elif ref.suffix == ".safetensors":
        assert_same_safetensors(ref, new)
    else:
        assert ref.read_bytes() == new.read_bytes(), new
