"""Faults in and around stored outputs: corrupt inputs, disk full mid-write, killed writers.

* A damaged store used as input is a :class:`StoreError` naming the store and the array, never
  a silently filled or silently wrong array (every chunk carries a CRC32C checksum).
* A writer that fails mid-write (``ENOSPC``) leaves the previous output byte for byte, no
  temporary beside it, and raises.
* A writer killed outright (SIGKILL) never leaves a partial output under the target's name; its
  hidden temporary breaks no later write, read or glob.

Everything runs in process on tiny arrays, except the killed writers (one short subprocess each).
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
import xarray as xr
import zarr
from safetensors.torch import save as safetensors_bytes
from torch import nn
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

from repdiag.core.errors import StoreError
from repdiag.core.store import open_store, write_json, write_store, write_text
from repdiag.encoders.embeddings import read_embeddings
from repdiag.encoders.jacobian import cache as jac
from repdiag.encoders.zoo import checkpoint
from tests.encoders.jacobian.models import engine
from tests.reliability.memory import peak_mib, reset_peak

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from repdiag.common.figures import save_figure

REPO = Path(__file__).resolve().parents[2]
ENCODING = {"emb_final": {"chunks": (2, 4)}, "labels": {"chunks": (3,)}}
ARRAYS = ("emb_final", "labels", "count", "image", "image_set")


EXACT = engine(method="exact")
"""The engine's settings at the schema's defaults, exact spectra."""


def dataset(value: float = 1.0) -> xr.Dataset:
    """An embeddings-like store: a chunked float layer, an int array, a scalar, string coords
    (variable-length ``image``, fixed-width ``image_set``)."""
    return xr.Dataset(
        {
            "emb_final": (
                ("image", "dim_final"),
                value + np.arange(24, dtype=np.float32).reshape(6, 4),
            ),
            "labels": (("image",), np.arange(6, dtype=np.int64)),
            "count": ((), np.int64(6)),
        },
        coords={
            "image": np.array([f"query/q{i:05d}" for i in range(6)], dtype=object),
            "image_set": ("image", np.array(["query"] * 3 + ["folder"] * 3)),  # fixed-width
        },
    )


def store(path: Path, value: float = 1.0) -> Path:
    return write_store(path, dataset(value), encoding=ENCODING)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (or ``root`` itself) by relative path, with its bytes."""
    if root.is_file():
        return {".": root.read_bytes()}
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def chunk_files(path: Path, name: str) -> list[Path]:
    return sorted(p for p in (path / name).rglob("*") if p.is_file() and p.name != "zarr.json")


def enospc(what: object) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(what))


def damaged(path: Path, array: str) -> str:
    """Pattern of an error naming the store ``path`` and the array ``array``."""
    return rf"store \S*{re.escape(path.name)}\b.*array '{array}'"


# ------------------------------------------------------------------------------ checksums


def test_every_array_is_checksummed_and_xarray_still_opens_the_store(tmp_path):
    path = store(tmp_path / "s.zarr")
    group = zarr.open_group(path, mode="r")
    names = sorted(name for name, _ in group.arrays())
    assert names == sorted(ARRAYS)
    for name in names:
        codecs = group[name].compressors
        assert isinstance(codecs[-1], Crc32cCodec), (name, codecs)
        assert any(isinstance(c, ZstdCodec) for c in codecs), (name, codecs)  # compression kept
    opened = xr.open_zarr(path).load()  # what a user inspecting a store types
    xr.testing.assert_equal(opened.drop_attrs(), dataset().drop_attrs())


def test_explicit_compressors_and_a_reopened_dataset_get_exactly_one_checksum(tmp_path):
    first = write_store(
        tmp_path / "a.zarr", dataset(), encoding={"emb_final": {"compressors": None}}
    )
    assert [type(c) for c in zarr.open_array(first / "emb_final").compressors] == [Crc32cCodec]
    again = write_store(tmp_path / "b.zarr", open_store(first))  # encodings carried over
    for name in ARRAYS:
        codecs = zarr.open_array(again / name).compressors
        assert sum(isinstance(c, Crc32cCodec) for c in codecs) == 1, (name, codecs)


def test_a_store_written_before_checksums_still_opens(tmp_path):
    path = tmp_path / "legacy.zarr"
    dataset().to_zarr(path, zarr_format=3, consolidated=True, write_empty_chunks=True)
    assert not isinstance(zarr.open_array(path / "emb_final").compressors[-1], Crc32cCodec)
    np.testing.assert_array_equal(open_store(path)["labels"].values, np.arange(6))


# -------------------------------------------------------------------- corrupt input stores


def truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def flip(file: Path) -> None:
    """Change a few bytes in place (same length)."""
    data = bytearray(file.read_bytes())
    for i in sorted({len(data) // 3, len(data) // 2, len(data) - 5}):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("fault", [truncate, flip], ids=["truncated", "flipped"])
@pytest.mark.parametrize("array", ARRAYS)
def test_a_damaged_chunk_is_an_error_naming_store_and_array(tmp_path, array, fault):
    path = store(tmp_path / "in.zarr")
    chunks = chunk_files(path, array)
    fault(chunks[len(chunks) // 2])
    with pytest.raises(StoreError, match=damaged(path, array) + r".*checksum"):
        open_store(path)


@pytest.mark.parametrize("fault", [truncate, flip], ids=["truncated", "flipped"])
def test_a_damaged_chunk_read_through_read_embeddings(tmp_path, fault):
    path = store(tmp_path / "emb.zarr")
    np.testing.assert_array_equal(
        read_embeddings(path, "final", "folder"), dataset()["emb_final"][3:]
    )
    fault(chunk_files(path, "emb_final")[1])
    with pytest.raises(StoreError, match=damaged(path, "emb_final")):
        read_embeddings(path, "final", "folder")


def test_a_deleted_chunk_is_an_error_naming_store_and_array(tmp_path):
    path = store(tmp_path / "in.zarr")
    chunk_files(path, "labels")[0].unlink()
    with pytest.raises(StoreError, match=damaged(path, "labels") + r" has 1 of 2 chunks missing"):
        open_store(path)


def _edit_json(file: Path, edit) -> None:
    data = json.loads(file.read_text())
    edit(data)
    file.write_text(json.dumps(data))


def _array_shape(meta: dict) -> None:
    meta["shape"][0] = 8  # valid JSON, wrong array


def _consolidated_dtype(meta: dict) -> None:
    meta["consolidated_metadata"]["metadata"]["emb_final"]["data_type"] = "float64"


@pytest.mark.parametrize(
    ("fault", "pattern"),
    [
        (lambda p: truncate(p / "emb_final" / "zarr.json"), r"has corrupt metadata"),
        (lambda p: flip(p / "emb_final" / "zarr.json"), r"has corrupt metadata"),
        (lambda p: (p / "emb_final" / "zarr.json").unlink(), r"has no metadata file zarr\.json"),
        (
            lambda p: _edit_json(p / "emb_final" / "zarr.json", _array_shape),
            r"disagrees with the consolidated metadata",
        ),
        (
            lambda p: _edit_json(p / "zarr.json", _consolidated_dtype),
            r"disagrees with the consolidated metadata",
        ),
    ],
    ids=["truncated", "flipped", "deleted", "edited", "consolidated-entry-edited"],
)
def test_corrupt_array_metadata_is_an_error_naming_store_and_array(tmp_path, fault, pattern):
    path = store(tmp_path / "in.zarr")
    fault(path)
    with pytest.raises(StoreError, match=damaged(path, "emb_final") + ".*" + pattern):
        open_store(path)


def _no_consolidated(meta: dict) -> None:
    del meta["consolidated_metadata"]


def _declare(shape: list[int], chunks: list[int]):
    """Edit emb_final's shape and chunks in its zarr.json and the consolidated entry alike, so
    that the store passes the consistency checks and only the declared sizes are wrong."""

    def edit(path: Path) -> None:
        def array(meta: dict) -> None:
            meta["shape"] = shape
            meta["chunk_grid"]["configuration"]["chunk_shape"] = chunks

        _edit_json(path / "emb_final" / "zarr.json", array)
        _edit_json(
            path / "zarr.json",
            lambda meta: array(meta["consolidated_metadata"]["metadata"]["emb_final"]),
        )

    return edit


@pytest.mark.parametrize(
    ("shape", "chunks", "pattern"),
    [
        ([10**8, 4], [1, 4], r"declares 100000000 chunks"),  # 63 s and 4 GB before
        ([10**10, 4], [1, 4], r"declares 10000000000 chunks"),  # MemoryError before
        ([2**32, 2**32], [2**32, 2**32], r"declares \d+ bytes"),  # int64 overflow before
        ([2**31, 4], [2**31, 4], r"declares 34359738368 bytes per decoded chunk"),
    ],
    ids=["1e8-chunks", "1e10-chunks", "2^64-elements", "32-GiB-chunk"],
)
def test_a_store_declaring_huge_sizes_is_refused_fast_naming_the_array(
    tmp_path, monkeypatch, shape, chunks, pattern
):
    """Refused from the metadata: zarr never opens an array (so never lists or decodes a chunk)
    and memory stays flat; no time is measured."""

    from repdiag.core import store as store_module
    from repdiag.core.inspect import describe_store

    path = store(tmp_path / "in.zarr")
    _declare(shape, chunks)(path)
    opened = []
    monkeypatch.setattr(
        store_module.zarr, "open_array", lambda *a, **k: opened.append(a) or pytest.fail("opened")
    )
    before = reset_peak()
    with pytest.raises(StoreError, match=damaged(path, "emb_final") + ".*" + pattern):
        open_store(path)
    with pytest.raises(StoreError, match=pattern):
        describe_store(path)
    assert opened == []
    assert peak_mib() - before < 500


@pytest.mark.parametrize(
    ("fault", "pattern"),
    [
        (truncate, r"the group has corrupt metadata \S*in\.zarr/zarr\.json"),
        (flip, r"the group has corrupt metadata \S*in\.zarr/zarr\.json"),
        (lambda f: f.unlink(), r"the group has no metadata file zarr\.json"),
        (lambda f: _edit_json(f, _no_consolidated), r"\S*zarr\.json has no consolidated metadata"),
    ],
    ids=["truncated", "flipped", "deleted", "consolidated-dropped"],
)
def test_corrupt_group_metadata_is_an_error_naming_the_store_and_file(tmp_path, fault, pattern):
    path = store(tmp_path / "in.zarr")
    fault(path / "zarr.json")
    with pytest.raises(StoreError, match=r"store \S*in\.zarr: " + pattern):
        open_store(path)


def test_a_store_truncated_to_its_metadata_is_an_error_naming_an_array(tmp_path):
    path = store(tmp_path / "in.zarr")
    for name in ARRAYS:
        for chunk in chunk_files(path, name):
            chunk.unlink()
    with pytest.raises(StoreError, match=r"array '(\w+)' has (\d) of \2 chunks missing"):
        open_store(path)
    for name in ARRAYS:  # now only the group's zarr.json is left
        for file in sorted((path / name).rglob("*"), reverse=True):
            file.rmdir() if file.is_dir() else file.unlink()
        (path / name).rmdir()
    assert listing(path) == ["zarr.json"]
    with pytest.raises(StoreError, match=r"array '\w+' has no metadata file zarr\.json"):
        open_store(path)


def test_non_finite_values_written_into_a_chunk_are_counted_and_named(tmp_path):
    path = store(tmp_path / "in.zarr")
    array = zarr.open_array(path / "emb_final", mode="r+")  # a valid chunk, valid checksum
    array[2:4] = [[np.nan, np.inf, 1.0, 2.0], [3.0, -np.inf, 4.0, 5.0]]
    with pytest.raises(StoreError, match=damaged(path, "emb_final") + r" has 3 non-finite"):
        open_store(path)
    with pytest.raises(StoreError, match=r"'emb_final' has 3 non-finite"):
        read_embeddings(path, "final", "query")


# --------------------------------------------------------------------- disk full mid-write


def _count_sets(monkeypatch, fail_at: int | None = None) -> list[str]:
    """Record the keys zarr writes; with ``fail_at``, write half of that one and raise ENOSPC."""
    real, keys = LocalStore.set, []

    async def counted(self, key, value):
        keys.append(key)
        if fail_at is not None and len(keys) == fail_at:
            await real(self, key, value[: len(value) // 2])
            raise enospc(key)
        return await real(self, key, value)

    monkeypatch.setattr(LocalStore, "set", counted)
    return keys


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("previous", [True, False], ids=["over-a-store", "new"])
def test_disk_full_while_writing_a_store(tmp_path, monkeypatch, where, previous):
    with monkeypatch.context() as m:  # how many writes a store takes
        probe = _count_sets(m)
        store(tmp_path / "probe.zarr")
    n_sets = len(probe)
    target = tmp_path / "out" / "s.zarr"
    if previous:
        store(target, 1.0)
    before = snapshot(target) if previous else None
    fail_at = {"first": 1, "middle": n_sets // 2, "last": n_sets}[where]
    keys = _count_sets(monkeypatch, fail_at)
    with pytest.raises(OSError) as err:
        store(target, 2.0)
    # zarr writes chunks concurrently: writes already under way may finish after the failed one
    assert err.value.errno == errno.ENOSPC and len(keys) >= fail_at
    monkeypatch.undo()
    assert listing(target.parent) == (["s.zarr"] if previous else [])
    if previous:
        assert snapshot(target) == before
        np.testing.assert_array_equal(open_store(target)["emb_final"], dataset(1.0)["emb_final"])


@pytest.mark.parametrize("writer", [write_json, write_text], ids=["json", "text"])
def test_disk_full_while_writing_a_small_file(tmp_path, monkeypatch, writer):
    target = tmp_path / "out.json"
    old = {"good": [1, 2, 3]}
    write_json(target, old)
    before = target.read_bytes()

    def half_then_enospc(self, data, *args, **kwargs):
        with open(self, "w") as handle:
            handle.write(data[: len(data) // 2])
        raise enospc(self)

    monkeypatch.setattr(Path, "write_text", half_then_enospc)
    new = {"new": list(range(100))}
    with pytest.raises(OSError) as err:
        writer(target, new if writer is write_json else json.dumps(new))
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert target.read_bytes() == before and listing(tmp_path) == ["out.json"]


def _tiny_backbone(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def _save_run(run_dir: Path, seed: int) -> None:
    checkpoint.save_zoo_run(
        _tiny_backbone(seed),
        None,
        {"objective": "mae", "seed": seed},
        [1.0, 0.5 + seed],
        run_dir / "model.safetensors",
        run_dir / "meta.json",
        run_dir / "curve.csv",
    )


def test_disk_full_while_saving_a_zoo_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "zoo" / "mae"
    _save_run(run_dir, seed=0)
    before = snapshot(run_dir)

    def half_then_enospc(tensors, filename, metadata=None):
        data = safetensors_bytes(tensors, metadata=metadata)
        Path(filename).write_bytes(data[: len(data) // 2])
        raise enospc(filename)

    monkeypatch.setattr(checkpoint, "save_file", half_then_enospc)
    with pytest.raises(OSError) as err:
        _save_run(run_dir, seed=1)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert snapshot(run_dir) == before
    assert listing(run_dir) == ["curve.csv", "meta.json", "model.safetensors"]


def _small_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5)).to(torch.float64)


def _half_zip_then_enospc(file, *args, **kwargs):
    file.write(b"PK\x03\x04" + bytes(64))
    raise enospc(getattr(file, "name", file))


def test_disk_full_while_writing_a_jacobian_cache_chunk(tmp_path, monkeypatch):
    model, x = _small_mlp(), torch.randn(5, 6, dtype=torch.float64)
    reference = jac.run_chunked(model, x, tmp_path / "reference", chunk_size=2, **EXACT)
    good = tmp_path / "reference" / "chunk_0001.npz"
    before = good.read_bytes()
    monkeypatch.setattr(jac.np, "savez", _half_zip_then_enospc)
    with pytest.raises(OSError) as err:  # rewriting a cached chunk over a good one
        jac._save_chunk(good, reference, 2)
    assert err.value.errno == errno.ENOSPC
    assert good.read_bytes() == before

    monkeypatch.undo()
    real, saves = np.savez, []

    def second_save_fails(file, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            return _half_zip_then_enospc(file)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(jac.np, "savez", second_save_fails)
    with pytest.raises(OSError) as err:  # a fresh run: the error reaches the caller
        jac.run_chunked(model, x, tmp_path / "run", chunk_size=2, **EXACT)
    assert err.value.errno == errno.ENOSPC
    assert listing(tmp_path / "run") == ["chunk_0000.npz"]  # no temporary, no partial chunk
    monkeypatch.undo()
    resumed = jac.run_chunked(model, x, tmp_path / "run", chunk_size=2, **EXACT)
    assert torch.equal(resumed["output"], reference["output"])


def _figure(value: float) -> Figure:
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, value])
    return fig


def test_disk_full_while_saving_a_figure(tmp_path, monkeypatch):
    png, pdf = tmp_path / "fig.png", tmp_path / "fig.pdf"
    save_figure(_figure(1.0), png, pdf)
    before = {png: png.read_bytes(), pdf: pdf.read_bytes()}
    real = Figure.savefig

    def half_then_enospc(self, fname, *args, **kwargs):
        real(self, fname, *args, **kwargs)
        data = Path(fname).read_bytes()
        Path(fname).write_bytes(data[: len(data) // 2])
        raise enospc(fname)

    monkeypatch.setattr(Figure, "savefig", half_then_enospc)
    fig = _figure(2.0)
    with pytest.raises(OSError) as err:
        save_figure(fig, png, pdf)
    assert err.value.errno == errno.ENOSPC
    assert not plt.fignum_exists(fig.number)  # closed all the same
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in before} == before
    assert listing(tmp_path) == ["fig.pdf", "fig.png"]


def test_a_failed_rename_puts_the_previous_store_back(tmp_path, monkeypatch):
    target = store(tmp_path / "s.zarr", 1.0)
    before = snapshot(target)
    real, calls = os.replace, []

    def second_rename_fails(src, dst):
        if Path(dst).parent == tmp_path:  # not zarr's own renames inside the store
            calls.append((src, dst))
            if len(calls) == 2:  # the new store onto the target, after the old one moved aside
                raise enospc(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", second_rename_fails)
    with pytest.raises(OSError):
        store(target, 2.0)
    monkeypatch.undo()
    assert len(calls) == 3  # aside, onto (failed), back
    assert listing(tmp_path) == ["s.zarr"] and snapshot(target) == before


# ------------------------------------------------------------------------- killed writers

KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, xarray as xr
    from zarr.storage import LocalStore
    from repdiag.core.store import write_store

    target, mode, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = []
    if mode == "write":
        real_set = LocalStore.set

        async def set_then_die(self, key, value):
            calls.append(key)
            if len(calls) == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return await real_set(self, key, value)

        LocalStore.set = set_then_die
    else:  # "rename": between moving the old store aside and moving the new one in
        real_replace = os.replace

        def replace_then_die(src, dst):
            if os.path.dirname(dst) == os.path.dirname(target):  # not zarr's, inside the store
                calls.append(dst)
                if len(calls) == at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst)

        os.replace = replace_then_die
    ds = xr.Dataset(
        {"emb_final": (("image", "dim"), np.full((6, 4), 9.0, np.float32))},
        coords={"image": np.array([f"q{i}" for i in range(6)], dtype=object)},
    )
    write_store(target, ds, encoding={"emb_final": {"chunks": (2, 4)}})
    print("not killed")
    """
)


def _killed_writer(target: Path, mode: str, at: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(target), mode, str(at)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)


def _leftovers(folder: Path, name: str, kind: str = "tmp") -> list[Path]:
    writer = r"(?:.+-\d+-)?" if kind == "tmp" else ""  # a temporary names its host and pid
    pattern = re.compile(rf"\.{re.escape(name)}\.{kind}-{writer}[0-9a-f]{{8}}")
    return [p for p in folder.iterdir() if pattern.fullmatch(p.name)]


def _assert_invisible_to_globs(folder: Path, outputs: list[str]) -> None:
    from snakemake.io import glob_wildcards

    assert sorted(Path(p).name for p in glob.glob(str(folder / "*"))) == outputs
    assert sorted(glob_wildcards(str(folder / "{model}.zarr")).model) == [
        name.removesuffix(".zarr") for name in outputs if name.endswith(".zarr")
    ]


@pytest.mark.parametrize("previous", [True, False], ids=["over-a-store", "new"])
def test_a_writer_killed_mid_store_leaves_the_target_untouched(tmp_path, previous):
    target = tmp_path / "m.zarr"
    if previous:
        store(target, 1.0)
        before = snapshot(target)
    _killed_writer(target, "write", at=4)
    left = _leftovers(tmp_path, "m.zarr")
    assert len(left) == 1 and left[0].is_dir()  # the killed writer's temporary, hidden
    if previous:
        assert snapshot(target) == before
        assert open_store(target)["emb_final"].values[0, 0] == 1.0
    else:
        assert not target.exists()
        with pytest.raises(StoreError, match=r"m\.zarr does not exist: run the workflow rule"):
            open_store(target)  # never falls back on the temporary
    _assert_invisible_to_globs(tmp_path, ["m.zarr"] if previous else [])

    store(target, 3.0)  # the next write of the target removes the killed writer's temporary
    assert open_store(target)["emb_final"].values[0, 0] == 3.0
    assert _leftovers(tmp_path, "m.zarr") == []
    _assert_invisible_to_globs(tmp_path, ["m.zarr"])


def test_a_writer_killed_while_replacing_a_store(tmp_path):
    target = store(tmp_path / "m.zarr", 1.0)
    before = snapshot(target)
    _killed_writer(target, "rename", at=2)  # after moving the old store aside
    assert not target.exists()
    (old,) = _leftovers(tmp_path, "m.zarr", "old")
    assert snapshot(old) == before  # the previous version, whole, under a hidden name
    with pytest.raises(StoreError, match=r"does not exist \(a writer killed .* at \S+\.old-"):
        open_store(target)
    _assert_invisible_to_globs(tmp_path, [])
    store(target, 3.0)
    assert open_store(target)["emb_final"].values[0, 0] == 3.0
    _assert_invisible_to_globs(tmp_path, ["m.zarr"])


@pytest.mark.parametrize(
    "damage",
    ["not a zip", "cut zip", "empty", "no meta", "meta not json", "meta lacks n", "pickled array"],
)
def test_an_unreadable_jacobian_cache_chunk_is_recomputed_and_logged(tmp_path, caplog, damage):
    """Issue 22, case 8: any failure to read a chunk counts as missing, never a stuck run."""
    model, x = _small_mlp(), torch.randn(5, 6, dtype=torch.float64)
    reference = jac.run_chunked(model, x, tmp_path / "reference", chunk_size=2, **EXACT)
    run = tmp_path / "run"
    jac.run_chunked(model, x, run, chunk_size=2, **EXACT)
    chunk = run / "chunk_0001.npz"
    good = chunk.read_bytes()
    if damage == "not a zip":
        chunk.write_bytes(b"garbage" * 10)
    elif damage == "cut zip":
        chunk.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        chunk.write_bytes(b"")
    elif damage == "no meta":
        np.savez(chunk, s__output=np.zeros(2))
    elif damage == "meta not json":
        np.savez(chunk, meta=np.array("{not json"), s__output=np.zeros(2))
    elif damage == "meta lacks n":
        np.savez(chunk, meta=np.array('{"methods": {}}'), s__output=np.zeros(2))
    else:
        np.savez(chunk, meta=np.array("{}"), s__output=np.array([{"a": 1}], dtype=object))
    with caplog.at_level(logging.WARNING, logger="repdiag.encoders.jacobian.cache"):
        resumed = jac.run_chunked(model, x, run, chunk_size=2, **EXACT)
    assert torch.equal(resumed["output"], reference["output"])
    assert "chunk_0001.npz" in caplog.text and "recomputing" in caplog.text
    assert chunk.read_bytes() != b"" and jac._load_chunk(chunk, ["output"], 2) is not None


def test_the_jacobian_cache_key_and_chunks_carry_the_thread_count(tmp_path, caplog):
    """Issue 22, case 4: spectra differ in the last bits across thread counts, so a resume
    under another --cores must not mix chunks: the cache key changes and a chunk written with
    another count is recomputed (logged)."""
    settings = {"method": "exact", "k": 4}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        key_1 = jac.cache_key(settings, "m", "i")
        model, x = _small_mlp(), torch.randn(4, 6, dtype=torch.float64)
        jac.run_chunked(model, x, tmp_path / "run", chunk_size=2, **EXACT)
        torch.set_num_threads(2)
        key_2 = jac.cache_key(settings, "m", "i")
        with caplog.at_level(logging.WARNING, logger="repdiag.encoders.jacobian.cache"):
            jac.run_chunked(model, x, tmp_path / "run", chunk_size=2, **EXACT)
    finally:
        torch.set_num_threads(before)
    assert key_1 != key_2
    assert "computed with 1 threads, this run has 2" in caplog.text
