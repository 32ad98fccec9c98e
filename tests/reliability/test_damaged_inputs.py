"""A damaged store used as input by the next job: a clear error naming store and array.

On a copy of the completed test run, one input store of a consumer job is damaged the way disks,
copies and interrupted syncs damage files; the consumer is forced to rerun (``snakemake -f``) and
must fail, naming the store and the array in its log, and never write its output. The library
level of each fault is in ``test_store_faults.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.conftest import snakemake


def chunk_files(array_dir: Path) -> list[Path]:
    return sorted(p for p in (array_dir / "c").rglob("*") if p.is_file())


def flip_bytes(store: Path, array: str) -> None:
    chunk = chunk_files(store / array)[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))


def truncate_chunk(store: Path, array: str) -> None:
    chunk = chunk_files(store / array)[-1]
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])


def delete_chunk(store: Path, array: str) -> None:
    chunk_files(store / array)[0].unlink()


def corrupt_metadata(store: Path, array: str) -> None:
    (store / array / "zarr.json").write_text('{"zarr_format": 3, "node_type": "arr')


def inject_nan(store: Path, array: str) -> None:
    values = zarr.open_array(store / array, mode="r+")
    values[:3, 0] = [np.nan, np.inf, -np.inf]


# (fault, store, array, consumer output, pattern the consumer log must show)
CASES: dict[str, tuple[Callable[[Path, str], None], str, str, str, str]] = {
    "flipped bytes in an embeddings chunk": (
        flip_bytes,
        "results/embeddings/mae.zarr",
        "emb_final",
        "results/metrics/mae.json",
        r"mae\.zarr.*'emb_final'.*checksum",
    ),
    "truncated embeddings chunk": (
        truncate_chunk,
        "results/embeddings/mae.zarr",
        "emb_block00",
        "results/metrics/mae.json",
        r"mae\.zarr.*'emb_block00'",
    ),
    "NaN and inf in embeddings": (
        inject_nan,
        "results/embeddings/mae.zarr",
        "emb_final",
        "results/metrics/mae.json",
        r"mae\.zarr.*'emb_final' has 3 non-finite",
    ),
    "deleted dataset chunk": (
        delete_chunk,
        "results/datasets/binding.zarr",
        "pair_same",
        "results/metrics/mae.json",
        r"binding\.zarr.*'pair_same' has 1 of \d+ chunks missing",
    ),
    "corrupt array metadata in a Jacobian store": (
        corrupt_metadata,
        "results/jacobians/mae.zarr",
        "jer_pr",
        "results/tables/models.csv",
        r"mae\.zarr.*'jer_pr'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_input_store_stops_its_consumer_naming_the_array(
    completed: Path, case: str
) -> None:
    damage, store, array, consumer, pattern = CASES[case]
    damage(completed / store, array)
    proc = snakemake(completed, "-f", consumer, check=False)
    logs = "\n".join(p.read_text() for p in sorted((completed / "logs").rglob("*.log")))
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert re.search(pattern, logs), logs[-3000:]
    assert not (completed / consumer).exists()
