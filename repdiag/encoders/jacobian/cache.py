"""The restartable chunked driver of the engine: images are cached (atomically, outside the declared
output) in chunks of ``chunk_size``, so a killed job resumes where it stopped and gives the same
result as an uninterrupted run (:func:`run_chunked`); the cache folder is named by a hash of
everything that determines the spectra (:func:`cache_key`).

``chunk_size`` is the restart granularity only. One engine call takes as many whole chunks as one
pass of ``batch_size`` Jacobian-vector products can hold (a randomized pass holds
``batch_size // k`` images of k products each; :func:`chunks_per_call`), so a pass is never
capped at ``chunk_size x k`` products. Calls cover fixed runs of chunks (0..m-1, m..2m-1, ...)
and a resumed run reuses the ``batch_size`` its cached chunks were computed with, so its passes,
hence its bits, are those of an uninterrupted run. ``batch_size=None`` on CUDA is sized from the
planner's memory estimate and the device's free memory (:mod:`.pass_size`)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from repdiag.core.errors import ConfigError
from repdiag.core.runtime import Progress
from repdiag.core.store import atomic_path
from repdiag.encoders.jacobian.engine import (
    DEFAULT_BATCH_SIZE,
    Readout,
    Spectra,
    jacobian_spectra,
)
from repdiag.encoders.jacobian.options import chunks_per_call

log = logging.getLogger(__name__)


def _digest_update(digest: Any, tensor: torch.Tensor) -> None:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes."""
    digest = hashlib.sha256()
    _digest_update(digest, torch.as_tensor(tensor))
    return digest.hexdigest()


def model_fingerprint(model: Any) -> str:
    """sha256 of every parameter and buffer (names, dtypes, shapes, values) of the model's module."""
    module = Readout(model).module
    digest = hashlib.sha256(type(model).__qualname__.encode())
    if module is not None:
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            _digest_update(digest, tensor)
    return digest.hexdigest()


def cache_key(settings: Mapping[str, Any], model_digest: str, images_digest: str) -> str:
    """Name of the cache folder: a hash of everything that determines the spectra, bit for bit.

    That includes torch's intra-op thread count: CPU reductions are split by thread, so spectra
    computed with another ``--cores`` differ in the last bits and must not be mixed in one store.
    """
    payload = json.dumps(
        {
            "settings": settings,
            "model": model_digest,
            "images": images_digest,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _save_chunk(path: Path, spectra: Spectra, n_images: int, batch_size: int | None = None) -> None:
    meta = {
        "batch_size": batch_size,
        "methods": spectra.methods,
        "d_out": spectra.d_out,
        "d_in": spectra.d_in,
        "n": n_images,
        "threads": torch.get_num_threads(),
    }
    arrays = {f"s__{name}": values.numpy() for name, values in spectra.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, meta=np.array(json.dumps(meta)), **arrays)


def _load_chunk(path: Path, layers: Sequence[str], n_images: int) -> Spectra | None:
    """A cached chunk, or None when it is absent or unusable (then it is recomputed).

    Any failure to read it (a cut or corrupt zip, bad JSON, a missing key, wrong dtype) counts
    as missing: the chunk is logged by name and recomputed, never a stuck run.
    """
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            spectra = Spectra((name, torch.from_numpy(data[f"s__{name}"])) for name in layers)
        methods = {name: str(meta["methods"][name]) for name in layers}
        d_out = {name: int(meta["d_out"][name]) for name in layers}
        d_in, n, threads = int(meta["d_in"]), int(meta["n"]), meta.get("threads")
    except Exception as err:  # zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, ...
        log.warning(
            "ignoring unreadable cached chunk %s (%s: %s); recomputing it",
            path.name,
            type(err).__name__,
            err,
        )
        return None
    if n != n_images or any(len(values) != n_images for values in spectra.values()):
        log.warning("ignoring cached chunk %s: it holds another number of images", path.name)
        return None
    if threads != torch.get_num_threads():
        log.warning(
            "ignoring cached chunk %s: computed with %s threads, this run has %d (results "
            "differ in the last bits across thread counts); recomputing it",
            path.name,
            threads,
            torch.get_num_threads(),
        )
        return None
    spectra.methods, spectra.d_out, spectra.d_in = methods, d_out, d_in
    return spectra


def _merge(chunks: Sequence[Spectra]) -> Spectra:
    first = chunks[0]
    merged = Spectra((name, torch.cat([chunk[name] for chunk in chunks])) for name in first)
    merged.methods, merged.d_out, merged.d_in = first.methods, first.d_out, first.d_in
    return merged


def _split(spectra: Spectra, sizes: Sequence[int]) -> list[Spectra]:
    """One engine call's spectra cut back into its chunks (``sizes`` images each)."""
    parts = {name: torch.split(values, list(sizes)) for name, values in spectra.items()}
    chunks = []
    for index in range(len(sizes)):
        chunk = Spectra((name, parts[name][index].clone()) for name in spectra)
        chunk.methods, chunk.d_out, chunk.d_in = spectra.methods, spectra.d_out, spectra.d_in
        chunks.append(chunk)
    return chunks


def resumed_batch_size(cache_dir: Path) -> int | None:
    """The ``batch_size`` the cached chunks in ``cache_dir`` were computed with (None: none)."""
    for path in sorted(cache_dir.glob("chunk_*.npz")):
        try:
            with np.load(path, allow_pickle=False) as data:
                value = json.loads(str(data["meta"])).get("batch_size")
        except Exception:  # an unreadable chunk is recomputed by _load_chunk; look further
            continue
        if value is not None:
            return int(value)
    return None


def _call_batch_size(
    model: Any,
    images: torch.Tensor,
    cache_dir: Path,
    engine: dict[str, Any],
    layers: Sequence[str],
) -> tuple[int, str]:
    """(batch_size, where it came from) for this run: the cached chunks', else the given one,
    else on CUDA the largest the free memory holds, else the device's default."""
    resumed = resumed_batch_size(cache_dir)
    if resumed is not None:
        return resumed, "resumed from the cached chunks"
    if engine.get("batch_size"):
        return int(engine["batch_size"]), "given"
    device = torch.device(engine.get("device") or images.device)
    if device.type == "cuda":
        from repdiag.encoders.jacobian.pass_size import memory_batch_size

        sized = memory_batch_size(model, images, {**engine, "layers": list(layers)}, device)
        return sized, "sized to free GPU memory"
    return DEFAULT_BATCH_SIZE["cpu"], "CPU default"


def run_chunked(
    model: Any,
    images: torch.Tensor,
    cache_dir: str | Path,
    *,
    chunk_size: int,
    layers: Sequence[str] | None = None,
    label: str = "Jacobian spectra",
    **engine: Any,
) -> Spectra:
    """:func:`~.engine.jacobian_spectra` over ``images``, cached in chunks of ``chunk_size``
    images in ``cache_dir``; ``engine``: its settings (:func:`.options.engine_options`).

    Each engine call takes :func:`chunks_per_call` whole chunks (fixed runs 0..m-1, m..2m-1,
    ...); its chunks are written atomically to ``cache_dir/chunk_XXXX.npz`` with the
    ``batch_size`` used, and reused by a later call, so a killed run resumes with the missing
    runs of chunks only, with the same passes: the result equals an uninterrupted run bit for
    bit. ``cache_dir`` must be specific to the model, images and settings (see
    :func:`cache_key`). The result's ``batch_size`` is the one used.
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1 (got {chunk_size})")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    layers = Readout(model).check(layers)
    batch_size, source = _call_batch_size(model, images, cache_dir, engine, layers)
    engine = {**engine, "batch_size": batch_size}
    per_call = chunks_per_call(batch_size, int(engine["k"]), chunk_size)
    log.info(
        "%s: batch_size %d (%s), %d chunks of %d images per engine call",
        label, batch_size, source, per_call, chunk_size,
    )  # fmt: skip
    n_total = len(images)
    starts = list(range(0, n_total, chunk_size))
    progress = Progress(n_total, label)
    chunks, reused = [], 0
    for first in range(0, len(starts), per_call):
        indices = range(first, min(first + per_call, len(starts)))
        sizes = [min(chunk_size, n_total - starts[i]) for i in indices]
        paths = [cache_dir / f"chunk_{i:04d}.npz" for i in indices]
        cached = [_load_chunk(path, layers, size) for path, size in zip(paths, sizes, strict=True)]
        if all(chunk is not None for chunk in cached):
            reused += len(cached)
        else:
            part = images[starts[indices[0]] : starts[indices[0]] + sum(sizes)]
            cached = _split(jacobian_spectra(model, part, layers=layers, **engine), sizes)
            for path, chunk, size in zip(paths, cached, sizes, strict=True):
                _save_chunk(path, chunk, size, batch_size)
        chunks.extend(cached)
        progress.update(sum(sizes))
    if reused:
        log.info("%s: reused %d cached chunks of %d from %s", label, reused, len(chunks), cache_dir)
    merged = _merge(chunks)
    merged.batch_size = batch_size
    return merged
