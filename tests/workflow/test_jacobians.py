"""Workflow outputs of rule jacobian_spectra on config/test.yaml, checked against independent sums."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

pytestmark = pytest.mark.workflow


def _config(workdir: Path) -> dict:
    from repdiag.core.config import fill_defaults

    return fill_defaults(yaml.safe_load((workdir / "config" / "test.yaml").read_text()))


def test_every_model_has_a_labelled_store_and_a_depth_profile(workflow_run: Path) -> None:
    config = _config(workflow_run)
    options = config["jacobians"]
    k, q = options["k"], options["power_iters"]
    n_binding, n_noise = options["probes"]["binding"]["n"], options["probes"]["noise"]["n"]
    for model in config["models"]:
        ds = xr.open_zarr(workflow_run / "results" / "jacobians" / f"{model}.zarr")
        assert ds["singular_values"].dims == ("layer", "image", "rank") and ds.sizes["rank"] == k
        assert list(ds["probe_set"].values) == ["binding"] * n_binding + ["noise"] * n_noise
        assert list(ds["image"].values[:2]) == ["query/q00000", "query/q00001"]
        assert ds.attrs["device"] == "cpu" and ds.attrs["k"] == k and ds.attrs["power_iters"] == q
        layers = list(ds["layer"].values)
        for index, layer in enumerate(layers):
            wanted = "exact" if ds.attrs["d_out"][layer] <= k * (2 * q + 2) else "randomized"
            # a chain-rule tap (final of the last block, head of final) is exact with its parent
            parent = "final" if layer == "head" else layers[index - 1] if index else None
            chained = layer in ("final", "head") and ds.attrs["methods"].get(parent) == "exact"
            assert ds.attrs["methods"][layer] in ({wanted, "exact"} if chained else {wanted})
        s = ds["singular_values"].values.astype(np.float64)
        assert np.all(s >= 0) and np.all(np.diff(s, axis=-1) <= 1e-6 * s[..., :1])
        participation = s.sum(-1) ** 2 / (s**2).sum(-1)  # the paper's JER, computed here again
        np.testing.assert_allclose(ds["jer_pr"].values, participation, rtol=1e-5)
        assert np.all((participation >= 1) & (participation <= k))

        report = json.loads((workflow_run / "results" / "jacobians" / f"{model}.json").read_text())
        assert (
            report["layers"] == list(ds["layer"].values)
            and report["methods"] == ds.attrs["methods"]
        )
        for layer in report["layers"]:
            for probe_set in ("binding", "noise"):
                mask = ds["probe_set"].values == probe_set
                entry = report["depth_profile"][layer][probe_set]["pr"]
                assert entry["n"] == mask.sum()
                assert entry["mean"] == pytest.approx(
                    participation[list(ds["layer"].values).index(layer), mask].mean(), rel=1e-5
                )
                assert entry["ci_low"] <= entry["mean"] <= entry["ci_high"]
    assert not any(
        (workflow_run / "results" / "jacobians" / ".cache").glob("*/*")
    )  # caches dropped
    log = (
        workflow_run / "logs" / "jacobian_spectra" / f"{next(iter(config['models']))}.log"
    ).read_text()
    assert "running on the CPU" in log and "Jacobian spectra on device cpu" in log


def test_stored_exact_spectrum_matches_autograd_on_the_trained_encoder(workflow_run: Path) -> None:
    import torch

    from repdiag.binding.jacobian_stage import noise_images
    from repdiag.encoders import build_encoder

    config = _config(workflow_run)
    model, entry = next(iter(config["models"].items()))
    ds = xr.open_zarr(workflow_run / "results" / "jacobians" / f"{model}.zarr")
    layer = next(name for name, method in ds.attrs["methods"].items() if method == "exact")
    encoder = build_encoder(model, entry, zoo_dir=workflow_run / "results" / "zoo")
    noise = config["jacobians"]["probes"]["noise"]
    size = encoder.preprocess.input_size
    x = encoder.preprocess(noise_images(1, size, noise["std"], config["jacobians"]["seed"]))[0]
    jacobian = torch.autograd.functional.jacobian(
        lambda inp: encoder.layer_outputs(inp[None], [layer])[layer][0], x
    )
    expected = torch.linalg.svdvals(jacobian.reshape(jacobian.shape[0], -1).double()).numpy()
    stored = ds["singular_values_full"].sel(layer=layer, image="noise/n00000").values
    n = int(ds["n_singular"].sel(layer=layer))
    np.testing.assert_allclose(stored[:n], expected, rtol=1e-3, atol=1e-4 * expected[0])
