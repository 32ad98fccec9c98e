"""The Jacobian stage of the workflow: probe images, the spectra store and the depth profile.

``results/jacobians/<model>.zarr``: the spectra store of :mod:`repdiag.encoders.jacobian.store`
(docs/contracts.md), with attrs ``model``, ``method`` (requested), ``methods`` (per layer), ``k``,
``power_iters``, ``seed``, ``device``, ``precision`` (requested), ``numerics`` (what it computed
in: ``precision_effective``, the TF32 and determinism switches; :func:`repdiag.core.gpu.numerics`),
``d_in``, ``d_out``, ``probe_sets``, ``batch_size``, ``chunk_size``.
``results/jacobians/<model>.json`` holds the depth profile: per layer, probe set and formula, the
mean JER with a 95% t confidence interval, and the drop into each layer from the one before,
paired over images, with its 95% t interval (``depth_drops``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from repdiag.common.intervals import mean_interval
from repdiag.core.errors import ConfigError
from repdiag.core.gpu import numerics
from repdiag.core.store import write_json, write_store
from repdiag.encoders.jacobian.cache import (
    cache_key,
    model_fingerprint,
    run_chunked,
    tensor_digest,
)
from repdiag.encoders.jacobian.options import JacobianSettings
from repdiag.encoders.jacobian.store import spectra_dataset

log = logging.getLogger(__name__)

CI_LEVEL = 0.95


@dataclasses.dataclass
class Probes:
    """Probe images, preprocessed: ``ids`` (N,), ``probe_set`` (N,) and ``x`` (N, 3, S, S)."""

    ids: list[str]
    probe_set: list[str]
    x: torch.Tensor

    def counts(self) -> dict[str, int]:
        names, counts = np.unique(
            np.asarray(self.probe_set, dtype=object).astype(str), return_counts=True
        )
        return {str(name): int(count) for name, count in zip(names, counts, strict=True)}


def noise_images(n: int, size: int, std: float, seed: int) -> np.ndarray:
    """Gaussian-noise control images, uint8 (n, size, size, 3): clip(0.5 + std z, 0, 1) * 255."""
    rng = np.random.default_rng([int(seed), 0x6E6F697365])
    pixels = np.clip(0.5 + std * rng.standard_normal((n, size, size, 3)), 0.0, 1.0)
    return np.round(pixels * 255.0).astype(np.uint8)


def _binding_queries(store: str | Path | None, n: int) -> tuple[list[str], np.ndarray]:
    from repdiag.binding.store import image_sets, open_binding_store

    if store is None:
        raise ConfigError(
            "jacobians.probes.binding.n > 0 needs the binding store (results/datasets/binding.zarr)"
        )
    ids, images = image_sets(open_binding_store(store))["query"]
    if len(ids) < n:
        raise ConfigError(
            f"jacobians.probes.binding.n = {n} but {store} has only {len(ids)} queries; lower it"
        )
    return list(ids[:n]), images[:n]


def _folder_images(path: str | Path, n: int, size: int) -> tuple[list[str], np.ndarray]:
    from repdiag.encoders.preprocess import load_image_folder

    if not Path(path).is_dir():
        raise ConfigError(f"jacobians.probes.folder.path: {path} is not a folder of images")
    ids, images = load_image_folder(path, size, limit=n)  # decodes only the n it keeps
    return list(ids), images


def load_probes(
    probes: Mapping[str, Any],
    preprocess: Any,
    *,
    binding_store: str | Path | None = None,
    seed: int,
) -> Probes:
    """The probe sets of ``jacobians.probes`` (binding queries, noise, folder), preprocessed.

    ``preprocess``: the encoder's (uint8 (N, H, W, 3) -> float (N, 3, S, S), with ``input_size``).
    """
    size = int(preprocess.input_size)
    sets: list[tuple[str, list[str], np.ndarray]] = []
    n_binding = int(probes.get("binding", {}).get("n", 0))
    if n_binding:
        sets.append(("binding", *_binding_queries(binding_store, n_binding)))
    noise = probes.get("noise", {})
    if int(noise.get("n", 0)):
        n = int(noise["n"])
        ids = [f"noise/n{i:05d}" for i in range(n)]
        sets.append(("noise", ids, noise_images(n, size, float(noise["std"]), seed)))
    folder = probes.get("folder", {})
    if folder.get("path") and int(folder.get("n", 0)):
        sets.append(("folder", *_folder_images(folder["path"], int(folder["n"]), size)))
    if not sets:
        raise ConfigError("jacobians.probes: no probe images (every probe set is empty)")
    return Probes(
        ids=[i for _, ids, _ in sets for i in ids],
        probe_set=[name for name, ids, _ in sets for _ in ids],
        x=torch.cat([preprocess(images) for _, _, images in sets]),
    )


def mean_ci(values: np.ndarray, level: float = CI_LEVEL) -> dict[str, float | int | None]:
    """:func:`~repdiag.common.intervals.mean_interval` as a record; null where n < 2 leaves the
    interval undefined."""
    values = np.asarray(values, dtype=np.float64)
    mean, sd, low, high = mean_interval(values, level)
    n = int(np.isfinite(values).sum())
    if n < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "std": None, "n": n}
    return {"mean": mean, "ci_low": low, "ci_high": high, "std": sd, "n": n}


def layer_summaries(
    ds: xr.Dataset, formulas: Sequence[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{layer: {probe_set: {formula: {mean, ci_low, ci_high, std, n}}}}`` in depth order."""
    sets = np.asarray(ds["probe_set"].values, dtype=object).astype(str)
    profile: dict[str, dict[str, dict[str, Any]]] = {}
    for layer in np.asarray(ds["layer"].values, dtype=object).astype(str):
        profile[layer] = {}
        for name in dict.fromkeys(sets):
            rows = sets == name
            profile[layer][name] = {
                formula: mean_ci(ds[f"jer_{formula}"].sel(layer=layer).values[rows])
                for formula in formulas
            }
    return profile


def depth_drops(ds: xr.Dataset, formulas: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The drop into each layer after the first, paired over the probe images of each set.

    ``{layer: {probe_set: {formula: {from, mean, ci_low, ci_high, std, n, relative}}}}``:
    ``mean`` is the mean over images x of ``JER_from(x) - JER_layer(x)`` (positive = JER falls)
    with its Student-t interval (:func:`mean_ci`); ``relative`` is that mean over the mean JER of
    ``from`` (null when that is not positive). What the collapse rule of ``repdiag.binding.analysis.claims`` tests.
    """
    sets = np.asarray(ds["probe_set"].values, dtype=object).astype(str)
    layers = np.asarray(ds["layer"].values, dtype=object).astype(str)
    drops: dict[str, dict[str, dict[str, Any]]] = {}
    for previous, layer in itertools.pairwise(layers):
        drops[layer] = {}
        for name in dict.fromkeys(sets):
            rows = sets == name
            drops[layer][name] = {}
            for formula in formulas:
                values = ds[f"jer_{formula}"]
                before = np.asarray(values.sel(layer=previous).values[rows], dtype=np.float64)
                after = np.asarray(values.sel(layer=layer).values[rows], dtype=np.float64)
                entry = mean_ci(before - after)
                base = float(before.mean())
                entry["relative"] = entry["mean"] / base if base > 0 else None
                drops[layer][name][formula] = {"from": str(previous), **entry}
    return drops


def summary(ds: xr.Dataset, model: str, formulas: Sequence[str]) -> dict[str, Any]:
    """The JSON beside the store: settings, methods per layer and the depth profile."""
    keys = (
        "method",
        "methods",
        "k",
        "power_iters",
        "seed",
        "device",
        "precision",
        "d_in",
        "d_out",
        "probe_sets",
    )
    return {
        "model": model,
        **{key: ds.attrs[key] for key in keys if key in ds.attrs},
        "layers": [str(name) for name in ds["layer"].values],
        "formulas": list(formulas),
        "ci_level": CI_LEVEL,
        "depth_profile": layer_summaries(ds, formulas),
        "depth_drops": depth_drops(ds, formulas),
    }


def run_stage(
    encoder: Any,
    probes: Probes,
    jacobians: JacobianSettings,
    *,
    model: str,
    device: torch.device,
    store: str | Path,
    summary_path: str | Path,
    cache_root: str | Path = "results/jacobians/.cache",
    provenance: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Compute, write the store and the JSON atomically, then drop this run's chunk cache."""
    if hasattr(encoder, "to"):
        encoder.to(device)
    engine = jacobians.engine()
    layers = list(jacobians.layers) or None
    settings = {
        **engine,
        "chunk_size": jacobians.chunk_size,
        "layers": layers,
        "device": device.type,
    }
    x = probes.x.to(device)
    cache_dir = (
        Path(cache_root)
        / model
        / cache_key(settings, model_fingerprint(encoder), tensor_digest(probes.x))
    )
    log.info(
        "%s: Jacobian spectra of %d probe images %s on %s (%s); cache %s",
        model,
        len(probes.ids),
        probes.counts(),
        device,
        engine,
        cache_dir,
    )
    start = time.monotonic()
    # the engine sets these switches per chunk; held here too so that the store's provenance,
    # written in the block, records the switches the spectra were computed with
    with numerics(jacobians.precision, device) as record:
        spectra = run_chunked(
            encoder,
            x,
            cache_dir,
            chunk_size=jacobians.chunk_size,
            layers=layers,
            label=f"{model} Jacobian spectra",
            device=device,
            **engine,
        )
        elapsed = time.monotonic() - start
        log.info(
            "%s: methods per layer %s; %.1f s (%.2f s per image); numerics %s",
            model,
            spectra.methods,
            elapsed,
            elapsed / len(probes.ids),
            record,
        )
        attrs = _store_attrs(model, settings, device, record, probes, elapsed)
        # the products per pass the engine used (from the setting, or the device's free memory)
        attrs["batch_size"] = spectra.batch_size or jacobians.batch_size
        formulas = list(jacobians.formulas)
        ds = spectra_dataset(
            spectra, probes.ids, probes.probe_set, k=jacobians.k, formulas=formulas, attrs=attrs
        )
        write_store(store, ds, config=provenance, seed=jacobians.seed)
        write_json(summary_path, summary(ds, model, formulas))
    _drop_cache(cache_dir)
    return ds


def _store_attrs(
    model: str,
    settings: Mapping[str, Any],
    device: torch.device,
    record: Mapping[str, Any],
    probes: Probes,
    elapsed: float,
) -> dict[str, Any]:
    """The store's attrs beyond what :func:`spectra_dataset` records: the run's settings."""
    return {
        "model": model,
        "method": settings["method"],
        "power_iters": settings["power_iters"],
        "seed": settings["seed"],
        "device": str(device),
        "precision": settings["precision"],
        "numerics": dict(record),
        "probe_sets": probes.counts(),
        "batch_size_setting": settings["batch_size"],  # null: sized from free memory
        "chunk_size": settings["chunk_size"],
        # CPU results are bitwise reproducible at a fixed thread count only (see cache_key)
        "torch_threads": torch.get_num_threads(),
        "wall_time_s": round(elapsed, 3),
    }


def _drop_cache(cache_dir: Path) -> None:
    """Remove this run's chunks, and the model's cache folder when no other settings left any."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        cache_dir.parent.rmdir()  # only when no other settings left chunks there
