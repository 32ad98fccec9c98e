"""CIFAR-10's python-pickle batches, read with an allow-list unpickler.

Unpickling calls whatever globals the file names, so a pickle from the internet can run arbitrary
code. :class:`NumpyOnlyUnpickler` resolves only checked stand-ins for the few globals that rebuild
numpy arrays (``numpy._core.multiarray._reconstruct``, ``numpy.ndarray`` as a name, ``numpy.dtype``
of an integer type, integer scalars) and ``_codecs.encode`` (how protocol-2 pickles store bytes);
any other global is refused. A batch file can therefore only produce dicts, lists, strings,
numbers and integer numpy arrays of at most 2 dimensions, each filled from exactly its own bytes
in the file (numpy's array state ``(version, shape, dtype, fortran, data)``): an array that claims
more bytes than it holds (a 131-byte file claiming (N, 3072)) or is constructed without data
(``ndarray(shape)``, which allocates whatever the file claims, unfilled) is refused. Shared
references are counted as what they expand to (:func:`expanded_size`): at most one element per
byte of the file, which an honest batch meets with room to spare.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from repdiag.core.errors import StoreError

ARRAY_DTYPES = ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8")
"""The dtypes a CIFAR-10 batch's arrays may have: uint8 pixels, integer labels."""


def _refuse(what: str) -> StoreError:
    return StoreError(
        f"{what}: a CIFAR-10 batch holds only numpy arrays filled from their own bytes, lists and "
        "strings, so this file is not one (or was tampered with). Replace it with the official "
        "python version of CIFAR-10."
    )


def _allowed_dtype(name: Any, align: Any = False, copy: Any = True) -> np.dtype:
    """``numpy.dtype(name)`` for the names of :data:`ARRAY_DTYPES` only."""
    if name not in ARRAY_DTYPES:
        raise _refuse(f"dtype {name!r}")
    return np.dtype(name)


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocol-2 pickles carry bytes."""
    if not isinstance(text, str) or encoding != "latin1":
        raise _refuse(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


def _raw_bytes(raw: Any) -> bytes:
    # Python 2 pickles carry the bytes as a str, read back as latin1 (numpy.load docs).
    return raw.encode("latin1") if isinstance(raw, str) else raw


def _scalar(dtype: Any, raw: Any) -> Any:
    """A numpy integer scalar from exactly ``dtype.itemsize`` bytes."""
    raw = _raw_bytes(raw)
    if not isinstance(dtype, np.dtype) or dtype.str[1:] not in ARRAY_DTYPES:
        raise _refuse(f"a scalar of dtype {dtype!r}")
    if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        raise _refuse(f"a {dtype} scalar of {len(raw) if isinstance(raw, bytes) else '?'} bytes")
    return np.frombuffer(raw, dtype)[0]


class _PendingArray:
    """What ``_reconstruct`` returns; pickle's BUILD fills it from the bytes the file holds."""

    array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _refuse("an array state that is not numpy's (version, shape, dtype, order, data)")
        shape, dtype, fortran, raw = state[-4:]
        raw = _raw_bytes(raw)
        if (
            not isinstance(shape, tuple)
            or len(shape) > 2
            or not all(isinstance(n, int) and n >= 0 for n in shape)
            or not isinstance(dtype, np.dtype)
            or dtype.str[1:] not in ARRAY_DTYPES
            or not isinstance(raw, bytes)
        ):
            raise _refuse(f"an array of shape {shape!r} and dtype {dtype!r}")
        expected = math.prod(shape) * dtype.itemsize
        if len(raw) != expected:
            raise _refuse(
                f"an array that claims shape {shape} ({expected} bytes) but holds {len(raw)} bytes"
            )
        order = "F" if fortran else "C"
        self.array = np.frombuffer(raw, dtype).reshape(shape, order=order).copy()


def _new_array(subtype: Any, shape: Any, typecode: Any) -> _PendingArray:
    """numpy's ``_reconstruct(ndarray, (0,), b"b")``, the only call a pickled array makes."""
    if subtype is not _NDARRAY or shape != (0,) or _raw_bytes(typecode) != b"b":
        raise _refuse(f"_reconstruct({subtype!r}, {shape!r}, {typecode!r})")
    return _PendingArray()


class _NdarrayName:
    """Stands for ``numpy.ndarray`` in a pickle: a name to pass, never a constructor to call
    (``ndarray(shape)`` would allocate an array of whatever size the file claims, unfilled)."""

    def __call__(self, *args: Any) -> None:
        raise _refuse(f"numpy.ndarray{args!r}: an array constructed without data")

    def __repr__(self) -> str:
        return "numpy.ndarray"


_NDARRAY = _NdarrayName()
_MULTIARRAY = ("numpy.core.multiarray", "numpy._core.multiarray")
ALLOWED_GLOBALS = {
    **{(m, "_reconstruct"): _new_array for m in _MULTIARRAY},
    **{(m, "scalar"): _scalar for m in _MULTIARRAY},
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _allowed_dtype,
    ("_codecs", "encode"): _latin1,
}
"""The globals a CIFAR-10 batch may name, each a checked stand-in for numpy's own."""


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` (see module doc)."""

    def __init__(self, file: io.BufferedIOBase, source: Path) -> None:
        # latin1: the official batches were pickled by Python 2; numpy needs its str payloads as
        # latin1 to rebuild arrays (numpy.load docs).
        super().__init__(file, encoding="latin1")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise StoreError(
                f"{self.source}: refusing to unpickle {module}.{name}: a CIFAR-10 batch holds "
                "only numpy arrays, lists and strings, so this file is not one (or was tampered "
                "with). Replace it with the official python version of CIFAR-10."
            )
        return found


def _filled(value: Any, depth: int = 0) -> Any:
    """``value`` with every :class:`_PendingArray` replaced by its array (refused if unfilled)."""
    if isinstance(value, _PendingArray):
        if value.array is None:
            raise _refuse("an array that is never filled")
        return value.array
    if depth > 4:
        return value
    if isinstance(value, dict):
        return {k: _filled(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_filled(v, depth + 1) for v in value)
    return value


def expanded_size(value: Any) -> int:
    """Elements ``value`` holds once every shared reference is expanded, as ``np.asarray`` or a
    copy would expand it: 1 per object plus the sizes of a container's items, counted again each
    time an object is referenced (a pickle's memo lets a 541-byte file reference one list five
    levels deep, 3.1e8 ints once expanded). Computed without expanding: each object's size once,
    by identity. A container that holds itself is refused."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]  # every object stays reachable from value
    open_ids: set[int] = set()
    while stack:
        item, done = stack.pop()
        key = id(item)
        children = (
            [*item.keys(), *item.values()] if isinstance(item, dict)
            else item if isinstance(item, list | tuple) else ()
        )  # fmt: skip
        if done:
            open_ids.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            continue
        if key in sizes:
            continue
        if key in open_ids:
            raise _refuse("a list or dict that contains itself")
        if not children:
            sizes[key] = 1
            continue
        open_ids.add(key)
        stack.append((item, True))
        stack.extend((child, False) for child in children)
    return sizes[id(value)]


def read_pickle_batch(path: str | Path) -> dict[str, Any]:
    """One batch file as a dict with str keys, read with :class:`NumpyOnlyUnpickler`: every
    array it holds is filled from the file's own bytes (its size is bounded by the file's)."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            loaded = NumpyOnlyUnpickler(stream, path).load()
            size = os.fstat(stream.fileno()).st_size
        expanded = expanded_size(loaded)
        if expanded > size + 1024:  # each element takes at least one byte of pickle unless shared
            raise _refuse(
                f"lists that expand to {expanded} elements from a {size}-byte file (references "
                "shared through the pickle memo)"
            )
        batch = _filled(loaded)
    except StoreError as err:
        if str(err).startswith(str(path)):
            raise
        raise StoreError(f"{path}: refusing {err}") from err
    except Exception as err:  # truncated or not a pickle at all
        raise StoreError(
            f"{path} is not a readable CIFAR-10 batch ({type(err).__name__}: {err}); "
            "re-extract cifar-10-python.tar.gz"
        ) from err
    if not isinstance(batch, dict):
        raise StoreError(f"{path}: expected a pickled dict, found {type(batch).__name__}")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in batch.items()}
