"""The restartable chunked driver of the engine: images are processed in chunks whose spectra are
cached (atomically) outside the declared output, so a killed job resumes where it stopped and gives
the same result as an uninterrupted run (:func:`run_chunked`); the cache folder is named by a hash
of everything that determines the spectra (:func:`cache_key`)."""

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
from repdiag.encoders.jacobian.engine import Readout, Spectra, jacobian_spectra

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


def _save_chunk(path: Path, spectra: Spectra, n_images: int) -> None:
    meta = {
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
    """:func:`~.engine.jacobian_spectra` over chunks of ``chunk_size`` images, each cached in
    ``cache_dir``; ``engine``: its settings (:func:`.options.engine_options`).

    A finished chunk is written atomically to ``cache_dir/chunk_XXXX.npz`` and reused by a later
    call, so a killed run resumes with the missing chunks only. Chunks do not depend on each other
    (same directions for every image), so the result equals an uninterrupted run bit for bit.
    ``cache_dir`` must be specific to the model, images and settings (see :func:`cache_key`).
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1 (got {chunk_size})")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    layers = Readout(model).check(layers)
    n_total = len(images)
    progress = Progress(n_total, label)
    chunks, reused = [], 0
    for index, start in enumerate(range(0, n_total, chunk_size)):
        part = images[start : start + chunk_size]
        path = cache_dir / f"chunk_{index:04d}.npz"
        spectra = _load_chunk(path, layers, len(part))
        if spectra is None:
            spectra = jacobian_spectra(model, part, layers=layers, **engine)
            _save_chunk(path, spectra, len(part))
        else:
            reused += 1
        chunks.append(spectra)
        progress.update(len(part))
    if reused:
        log.info("%s: reused %d cached chunks of %d from %s", label, reused, len(chunks), cache_dir)
    return _merge(chunks)
