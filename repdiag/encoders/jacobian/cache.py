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
planner's memory estimate and the device's free memory (:mod:`.pass_size`); there the first engine
call measures its peak per image and the later calls are sized from it, and an out-of-memory
error in a call halves its pass and retries it. Every change of pass size is kept, from the chunk
where it starts, in ``passes.json`` beside the chunks (:class:`PassSizes`) before any chunk
computed with it is saved, so a resumed run makes the same passes; the record is the spectra's
``pass_sizing`` (the store's attrs)."""

from __future__ import annotations

import contextlib
import dataclasses
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
    """(batch_size, where it came from) for this run: the given one, else on CUDA the largest the
    free memory holds, else the device's default; the cached chunks' size where a resumed run's
    chunks were computed with another (so a resumed run whose size agrees records what an
    uninterrupted one does)."""
    intended = _intended_batch_size(model, images, engine, layers)
    resumed = resumed_batch_size(cache_dir)
    if resumed is not None and resumed != intended[0]:
        return resumed, "resumed from the cached chunks"
    return intended


def _intended_batch_size(
    model: Any, images: torch.Tensor, engine: dict[str, Any], layers: Sequence[str]
) -> tuple[int, str]:
    if engine.get("batch_size"):
        return engine["batch_size"], "given"
    device = torch.device(engine.get("device") or images.device)
    if device.type == "cuda":
        from repdiag.encoders.jacobian.pass_size import memory_batch_size

        sized = memory_batch_size(model, images, {**engine, "layers": list(layers)}, device)
        return sized, SIZED
    return DEFAULT_BATCH_SIZE["cpu"], "CPU default"


SIZED = "sized to free GPU memory"
PASSES_FILE = "passes.json"


@dataclasses.dataclass
class PassSizes:
    """The pass size of every engine call of a run: ``schedule`` [[first chunk, batch_size], ...]
    (a call starting at chunk i uses the last entry at or before i) and the ``record`` of how
    it came about (the store's ``pass_sizing``): ``source``, ``planned`` (the first size),
    ``measured_peak_bytes_per_image`` and ``measured_batch_size`` (from the first call on a
    GPU), ``out_of_memory`` ([{chunk, batch_size, retried_with}]). Saved atomically to
    ``passes.json`` in the cache folder whenever it changes."""

    path: Path
    schedule: list[list[int]]
    record: dict[str, Any]
    measure: bool = False  # the first call's peak is still to be measured

    @classmethod
    def start(cls, cache_dir: Path, batch_size: int, source: str, measure: bool) -> PassSizes:
        """The saved sizes of a resumed run, else a new schedule at ``batch_size``."""
        path = cache_dir / PASSES_FILE
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            saved = json.loads(path.read_text())
            record = {**saved["record"], "resumed": True}
            return cls(path, [[int(a), int(b)] for a, b in saved["schedule"]], record)
        record = {"source": source, "planned": int(batch_size), "out_of_memory": []}
        return cls(path, [[0, int(batch_size)]], record, measure)

    def at(self, chunk: int) -> int:
        return [size for first, size in self.schedule if first <= chunk][-1]

    def change(self, chunk: int, batch_size: int) -> None:
        """From ``chunk`` on, ``batch_size`` (later entries dropped); saved at once."""
        self.schedule = [entry for entry in self.schedule if entry[0] < chunk]
        self.schedule.append([int(chunk), int(batch_size)])
        self.record["schedule"] = self.schedule
        with atomic_path(self.path) as tmp:
            Path(tmp).write_text(json.dumps({"schedule": self.schedule, "record": self.record}))


def _measured_resize(
    passes: PassSizes, spectra: Spectra, call: tuple[int, int], k: int, device: torch.device
) -> None:
    """After the first call on a GPU (``call``: its first chunk and images): its peak per image
    (``torch.cuda.max_memory_allocated`` above what stays allocated), and the calls after it
    sized from that and the free memory (:func:`.pass_size.measured_batch_size`)."""
    from repdiag.encoders.jacobian.pass_size import measured_batch_size, pass_width

    peak = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    torch.cuda.empty_cache()  # the cached blocks of the pass count as free for the next ones
    free = float(torch.cuda.mem_get_info(device)[0])
    width = pass_width(spectra.methods, spectra.d_out, k)
    size, per_image = measured_batch_size(peak, passes.at(call[0]), call[1], width, free)
    passes.measure = False
    passes.record.update(measured_peak_bytes_per_image=per_image, measured_batch_size=size)
    log.info(
        "first engine call: peak %.3g GiB per image (%d products a pass); the remaining "
        "passes take %d products (%s free)", per_image / 2**30, passes.at(call[0]), size, free,
    )  # fmt: skip
    passes.change(call[0] + 1, size)


def _compute_call(
    model: Any,
    part: torch.Tensor,
    layers: Sequence[str],
    engine: dict[str, Any],
    passes: PassSizes,
    first: int,
) -> Spectra | None:
    """One engine call at the pass size of chunk ``first``; None after an out-of-memory error,
    when the pass was halved from ``first`` on (recorded) and the call is to be laid out again;
    a pass of one product that does not fit is raised."""
    batch_size = passes.at(first)
    device = torch.device(engine.get("device") or part.device)
    measuring = passes.measure and device.type == "cuda"
    if measuring:
        torch.cuda.reset_peak_memory_stats(device)
    try:
        spectra = jacobian_spectra(
            model, part, layers=layers, **{**engine, "batch_size": batch_size}
        )
    except torch.cuda.OutOfMemoryError as err:
        if batch_size <= 1:
            raise
        half = batch_size // 2
        log.warning(
            "out of GPU memory at %d products a pass (chunk %d): retrying at %d (%s)",
            batch_size, first, half, str(err).splitlines()[0][:200],
        )  # fmt: skip
        del err
        torch.cuda.empty_cache()
        passes.record["out_of_memory"].append(
            {"chunk": first, "batch_size": batch_size, "retried_with": half}
        )
        passes.change(first, half)
        return None
    if measuring:
        _measured_resize(passes, spectra, (first, len(part)), engine["k"], device)
    return spectra


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
    images in ``cache_dir``; ``engine``: its settings (:meth:`.options.JacobianSettings.engine`).

    Each engine call takes :func:`chunks_per_call` whole chunks (fixed runs 0..m-1, m..2m-1,
    ... at the pass size of :class:`PassSizes`); its chunks are written atomically to
    ``cache_dir/chunk_XXXX.npz`` with the ``batch_size`` used, and reused by a later call, so a
    killed run resumes with the missing runs of chunks only, with the same passes: the result
    equals an uninterrupted run bit for bit. ``cache_dir`` must be specific to the model,
    images and settings (see :func:`cache_key`). The result's ``batch_size`` is the one the
    last call used, its ``pass_sizing`` the record of :class:`PassSizes`.
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1 (got {chunk_size})")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    layers = Readout(model).check(layers)
    batch_size, source = _call_batch_size(model, images, cache_dir, engine, layers)
    passes = PassSizes.start(cache_dir, batch_size, source, measure=source == SIZED)
    k = engine["k"]
    log.info(
        "%s: batch_size %d (%s), %d chunks of %d images per engine call",
        label, passes.at(0), passes.record["source"], chunks_per_call(passes.at(0), k, chunk_size),
        chunk_size,
    )  # fmt: skip
    n_total = len(images)
    starts = list(range(0, n_total, chunk_size))
    progress = Progress(n_total, label)
    chunks, reused, first = [], 0, 0
    while first < len(starts):
        indices = range(
            first, min(first + chunks_per_call(passes.at(first), k, chunk_size), len(starts))
        )
        sizes = [min(chunk_size, n_total - starts[i]) for i in indices]
        paths = [cache_dir / f"chunk_{i:04d}.npz" for i in indices]
        cached = [_load_chunk(path, layers, size) for path, size in zip(paths, sizes, strict=True)]
        if all(chunk is not None for chunk in cached):
            reused += len(cached)
        else:
            passes.measure = passes.measure and indices[-1] + 1 < len(starts)  # calls after it
            part = images[starts[first] : starts[first] + sum(sizes)]
            spectra = _compute_call(model, part, layers, engine, passes, first)
            if spectra is None:
                continue  # out of memory: the same chunks again, in smaller passes
            cached = _split(spectra, sizes)
            for path, chunk, size in zip(paths, cached, sizes, strict=True):
                _save_chunk(path, chunk, size, passes.at(first))
        chunks.extend(cached)
        progress.update(sum(sizes))
        first = indices[-1] + 1
    if reused:
        log.info("%s: reused %d cached chunks of %d from %s", label, reused, len(chunks), cache_dir)
    merged = _merge(chunks)
    merged.batch_size = passes.at(len(starts) - 1)
    merged.pass_sizing = {**passes.record, "schedule": passes.schedule}
    return merged
