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

VOLATILE = re.compile(r"(^created$|time_s$|per_s$|seconds|^saved_sha256$)")
"""Keys that record time. ``saved_sha256`` is the hash of a run's saved steps file, which holds
each saved step's meta.json and so its wall time: its tensors are compared, its hash is not."""
ACROSS_COMMITS = re.compile(rf"{VOLATILE.pattern}|^git_commit$")
"""VOLATILE and the commit a store's provenance records: two commits' runs compared."""


def strip_volatile(value: Any, ignore: re.Pattern = VOLATILE) -> Any:
    """``value`` without the dict keys that ``ignore`` matches (wall time, rates, creation time)."""
    if isinstance(value, dict):
        return {k: strip_volatile(v, ignore) for k, v in value.items() if not ignore.search(str(k))}
    if isinstance(value, list):
        return [strip_volatile(v, ignore) for v in value]
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


def assert_same_store(ref: Path, new: Path, ignore: re.Pattern = VOLATILE) -> None:
    """:func:`assert_same_arrays`, and the same group and array attributes (times left out)."""
    assert_same_arrays(ref, new)
    ref_group, new_group = zarr.open_group(ref, mode="r"), zarr.open_group(new, mode="r")
    for name, array in ref_group.arrays():
        ref_attrs, new_attrs = dict(array.attrs), dict(new_group[name].attrs)
        assert strip_volatile(ref_attrs, ignore) == strip_volatile(new_attrs, ignore), name
    ref_attrs, new_attrs = dict(ref_group.attrs), dict(new_group.attrs)
    assert strip_volatile(ref_attrs, ignore) == strip_volatile(new_attrs, ignore), new


def assert_same_safetensors(ref: Path, new: Path) -> None:
    from safetensors.numpy import load_file

    ref_tensors, new_tensors = load_file(ref), load_file(new)
    assert sorted(ref_tensors) == sorted(new_tensors), new
    for name, tensor in ref_tensors.items():
        _same_array(f"{new}:{name}", tensor, new_tensors[name])


def assert_same_output(ref: Path, new: Path, ignore: re.Pattern = VOLATILE) -> None:
    """Fail with the first difference between two outputs (files, stores or folders)."""
    assert new.exists(), f"{new} is missing"
    if ref.suffix == ".zarr":
        assert_same_store(ref, new, ignore)
    elif ref.is_dir():  # entry by entry, so that a store inside is compared as a store
        ref_names = sorted(p.name for p in ref.iterdir())
        new_names = sorted(p.name for p in new.iterdir())
        assert ref_names == new_names, (new, ref_names, new_names)
        for name in ref_names:
            assert_same_output(ref / name, new / name, ignore)
    elif ref.suffix == ".json":
        ref_data, new_data = json.loads(ref.read_text()), json.loads(new.read_text())
        assert strip_volatile(ref_data, ignore) == strip_volatile(new_data, ignore), new
    elif ref.suffix == ".safetensors":
        assert_same_safetensors(ref, new)
    else:
        assert ref.read_bytes() == new.read_bytes(), new


def output_leaves(root: Path) -> set[Path]:
    """The outputs under ``root``, relative to it: files, and stores as one output each."""
    found = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if any(part.endswith(".zarr") for part in relative.parts[:-1]):
            continue  # inside a store: compared with it
        if path.suffix == ".zarr" or path.is_file():
            found.add(relative)
    return found


def differences(before: Path, after: Path, ignore: re.Pattern = ACROSS_COMMITS) -> list[str]:
    """Every output that only one folder holds or that differs between the two, one line each
    (empty when every output is equal)."""
    ref, new = output_leaves(before), output_leaves(after)
    found = [f"{rel}: only in {before}" for rel in sorted(ref - new)]
    found += [f"{rel}: only in {after}" for rel in sorted(new - ref)]
    for rel in sorted(ref & new):
        try:
            assert_same_output(before / rel, after / rel, ignore)
        except AssertionError as err:
            found.append(f"{rel}: differs ({str(err).splitlines()[0][:160]})")
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.outputs BEFORE AFTER``: every output under two workflow folders'
    ``results/`` compared, left out only what ACROSS_COMMITS matches (a refactor's before/after
    check: run one config at both commits, then compare); each difference printed, exit 1."""
    import sys

    before, after = (Path(arg) / "results" for arg in (argv or sys.argv[1:]))
    found = differences(before, after)
    for line in found:
        print(line)
    compared = len(output_leaves(before) | output_leaves(after))
    print(f"{after}: {compared} outputs, {len(found)} differ from {before}'s")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
