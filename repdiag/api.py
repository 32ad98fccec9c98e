"""repdiag in a notebook: one model on the binding benchmark, through the functions the workflow's
own steps call (``render_binding``, ``extract_embeddings``, ``compute_metrics``,
``jacobian_spectra``). Exported lazily by ``repdiag``::

    import repdiag
    config = repdiag.load_config("config/test.yaml")
    bench = repdiag.render_benchmark("work/binding.zarr", config)
    enc = repdiag.encoder(my_module)  # or a config entry: repdiag.encoder({"source": "timm", ...})
    scores = repdiag.measure(enc, bench, "work", config)  # binding per readout, Same/Different, geometry
    spectra = repdiag.jacobian_spectra(enc, bench, config)  # per-image JER of each tap

Above the studies (like ``repdiag.cli``): it imports the binding study and the encoders layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from repdiag.core import config as _config
from repdiag.encoders.factory import Encoder
from repdiag.studies import register

__all__ = ["encoder", "jacobian_spectra", "load_config", "measure", "render_benchmark"]


def load_config(path: str | Path) -> dict[str, Any]:
    """A YAML config read, validated by the workflow's schema and checked by every study's
    cross-key checks (registered here first: :func:`repdiag.studies.register`), defaults filled."""
    register()
    return _config.load_config(path)


def render_benchmark(out: str | Path, config: Mapping[str, Any]) -> Path:
    """Render ``config``'s binding benchmark (``datasets.binding``) into the store ``out``, as
    the rule ``render_binding`` does; returns its path."""
    from repdiag.binding.dataset import BindingSettings, chunk_encoding, render_binding_dataset
    from repdiag.core.store import write_store

    params = BindingSettings.from_config(config["datasets"]["binding"])
    ds = render_binding_dataset(params)
    write_store(out, ds, config=params.to_config(), seed=params.seed, encoding=chunk_encoding(ds))
    return Path(out)


def encoder(
    model: nn.Module | Mapping[str, Any], key: str = "model", *, family: str = "other"
) -> Encoder:
    """An encoder with its taps and preprocessing, from any ``nn.Module`` or from a config entry
    (``models.<key>`` of any source: timm, open_clip, torchvision, hub, checkpoint, python)."""
    from repdiag.encoders.factory import build_encoder, encoder_from_module

    if isinstance(model, nn.Module):
        return encoder_from_module(model, key, family=family)
    return build_encoder(key, {"family": family, **model})


def measure(
    enc: Encoder, benchmark: str | Path, workdir: str | Path, config: Mapping[str, Any]
) -> dict[str, Any]:
    """Embed the benchmark's image sets (``embeddings`` of ``config``) into
    ``workdir/<key>.zarr`` and score every tap as ``results/metrics/<key>.json`` does: binding
    accuracy per readout, the Same/Different probe and the geometry metrics (docs/contracts.md)."""
    from repdiag.binding.metrics.model_metrics import compute_model_metrics
    from repdiag.binding.metrics.options import MetricsSettings
    from repdiag.binding.store import image_sets, open_binding_store
    from repdiag.encoders.embeddings import extract_embeddings, write_embeddings

    settings = config["embeddings"]
    sets = image_sets(open_binding_store(benchmark))
    ds = extract_embeddings(
        enc,
        {name: sets[name] for name in settings["image_sets"]},
        batch_size=settings["batch_size"],
        device="cpu" if config.get("device") == "cpu" else "auto",
    )
    store = write_embeddings(Path(workdir) / f"{enc.key}.zarr", ds)
    return compute_model_metrics(
        benchmark,
        store,
        model=enc.key,
        family=enc.family,
        source=enc.source,
        settings=MetricsSettings.from_config(config["metrics"]),
        seed=int(config.get("seed", 0)),
    )


def jacobian_spectra(
    enc: Encoder,
    benchmark: str | Path,
    config: Mapping[str, Any],
    layers: Sequence[str] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per tap (default: every tap), the top-k singular values of the Jacobian of the first
    ``jacobians.probes.binding.n`` query images and their JER (``stats.jer_formula``), with the
    engine and settings of the rule ``jacobian_spectra``: ``{tap: {"singular_values": (n, k),
    "jer": (n,)}}``."""
    from repdiag.binding.store import image_sets, open_binding_store
    from repdiag.encoders.jacobian.engine import jacobian_spectra as spectra_of
    from repdiag.encoders.jacobian.jer import jer
    from repdiag.encoders.jacobian.options import JacobianSettings

    jacobians = JacobianSettings.from_config(config["jacobians"])
    _, images = image_sets(open_binding_store(benchmark))["query"]
    x = enc.preprocess(images[: jacobians.probes["binding"]["n"]])
    taps = list(layers or enc.layers)
    spectra = spectra_of(enc, x, layers=taps, **jacobians.engine())
    formula = config["stats"]["jer_formula"]
    return {
        tap: {"singular_values": spectra[tap].numpy(), "jer": jer(spectra[tap], formula).numpy()}
        for tap in taps
    }
