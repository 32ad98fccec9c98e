"""The allow-list unpickler of CIFAR-10 batches: arrays only from their own bytes."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from repdiag.cifar.pickles import expanded_size, read_pickle_batch
from repdiag.core.errors import StoreError

RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]


class ClaimsMore:
    """Pickles as numpy's own array recipe, with a shape far larger than the bytes it holds."""

    def __init__(self, shape: tuple[int, ...], raw: bytes) -> None:
        self.shape, self.raw = shape, raw

    def __reduce__(self):
        return (
            RECONSTRUCT,
            (np.ndarray, (0,), b"b"),
            (1, self.shape, np.dtype("u1"), False, self.raw),
        )


class Unfilled:
    """Pickles as ``numpy.ndarray(shape, uint8)``: an array allocated, never filled."""

    def __reduce__(self):
        return (np.ndarray, ((1000, 3072), np.dtype("u1")))


def _write(path: Path, obj, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_batch_round_trips_with_its_arrays_filled_from_the_file(tmp_path, protocol):
    data = np.arange(2 * 12, dtype=np.uint8).reshape(2, 12)
    labels = np.array([3, 7], dtype=np.int64)
    path = _write(
        tmp_path / "b",
        {"data": data, "labels": [1, 2], "ids": labels, "n": np.int64(5), "name": "x"},
        protocol,
    )
    batch = read_pickle_batch(path)
    np.testing.assert_array_equal(batch["data"], data)
    np.testing.assert_array_equal(batch["ids"], labels)
    assert batch["labels"] == [1, 2] and batch["n"] == 5 and batch["name"] == "x"
    assert batch["data"].flags.writeable and batch["data"].dtype == np.uint8


def test_an_array_claiming_more_bytes_than_it_holds_is_refused(tmp_path):
    path = _write(tmp_path / "b", {"data": ClaimsMore((100_000, 3072), b"\0" * 8), "labels": [0]})
    assert path.stat().st_size < 200
    with pytest.raises(StoreError, match=r"claims shape \(100000, 3072\) \(307200000 bytes\) but"):
        read_pickle_batch(path)


def test_an_array_constructed_without_data_is_refused(tmp_path):
    path = _write(tmp_path / "b", {"data": Unfilled(), "labels": [0]})
    with pytest.raises(StoreError, match=r"numpy\.ndarray.*an array constructed without data"):
        read_pickle_batch(path)


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (np.zeros((2, 3), np.float32), r"dtype 'f4'"),
        (np.zeros((2, 2, 2), np.uint8), r"an array of shape \(2, 2, 2\)"),
        (np.float64(1.5), r"dtype 'f8'"),
        (np.zeros(2, dtype=object), r"dtype 'O8'"),
    ],
    ids=["float32", "3-d", "float-scalar", "object"],
)
def test_arrays_cifar_does_not_hold_are_refused_naming_the_file(tmp_path, value, pattern):
    path = _write(tmp_path / "b", {"data": value})
    with pytest.raises(StoreError, match=r"\S*b: .*" + pattern):
        read_pickle_batch(path)


def test_shared_references_are_counted_as_what_they_expand_to(tmp_path):
    """Issue 60: lists and ints only (nothing for the allow-list to refuse), one list referenced
    50 times at each of five levels through the pickle memo: a file of a few hundred bytes whose
    labels expand to 50**5 = 3.1e8 ints in np.asarray. Refused from the counts, nothing expanded."""
    level = list(range(50))
    for _ in range(4):
        level = [level] * 50
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": [], "labels": level}, protocol=2))
    assert path.stat().st_size < 1000
    with pytest.raises(StoreError, match=r"lists that expand to 31\d{7} elements from a \d+-byte"):
        read_pickle_batch(path)


def test_a_list_that_holds_itself_is_refused(tmp_path):
    loop: list = []
    loop.append(loop)
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": [], "labels": loop}, protocol=2))
    with pytest.raises(StoreError, match="contains itself"):
        read_pickle_batch(path)


def test_expanded_size_counts_every_reference():
    shared = [1, 2, 3]
    assert expanded_size([shared, shared]) == 1 + 2 * 4  # the outer list, twice (list + 3 ints)
    assert expanded_size({"a": shared}) == 1 + 1 + 4  # dict, key, list of three
    assert expanded_size(np.zeros(1000)) == 1  # an array's elements are its own bytes
