"""The notebook face (repdiag.api), as a user runs it: the README's example, and the oracle
control at its ceiling through the face's own path (render, build, embed, score, Jacobians)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import repdiag
from repdiag.encoders.jacobian.jer import jer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[dict, Path]:
    torch.set_num_threads(1)
    config = repdiag.load_config(ROOT / "config" / "test.yaml")
    bench = repdiag.render_benchmark(tmp_path_factory.mktemp("api") / "binding.zarr", config)
    return config, bench


def test_the_face_is_lazy_and_complete() -> None:
    import repdiag.api

    assert set(repdiag.API) == set(repdiag.api.__all__)
    assert repdiag.measure is repdiag.api.measure
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        repdiag.nope  # noqa: B018


def test_the_readme_example_runs_as_written(setup, tmp_path, monkeypatch) -> None:
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "test.yaml").read_text())
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    scores, spectra = namespace["scores"], namespace["spectra"]
    final = scores["per_layer"][scores["final_layer"]]
    assert set(final["binding"]) == {"cosine", "knn", "local_pca"}
    assert 0.0 <= final["same_different"]["accuracy"] <= 1.0
    assert np.isfinite(spectra["final"]["jer"]).all()


def test_the_oracle_scores_the_ceiling_through_the_face(tmp_path) -> None:
    config = repdiag.load_config(ROOT / "config" / "test.yaml")
    config["datasets"]["binding"] = {"n_queries": 32}  # the default geometry: the controls'
    bench = repdiag.render_benchmark(tmp_path / "binding.zarr", config)
    entry = {"source": "python", "id": "repdiag.binding.controls:shape_oracle"}
    oracle = repdiag.encoder(entry, "oracle", family="control")
    final = repdiag.measure(oracle, bench, tmp_path, config)["per_layer"]["final"]
    assert {name: r["accuracy"] for name, r in final["binding"].items()} == {
        "cosine": 1.0,
        "knn": 1.0,
        "local_pca": 1.0,
    }


def test_a_module_gets_the_taps_and_spectra_of_the_engine(setup) -> None:
    config, bench = setup
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 6))
    module.preprocess_cfg = {"input_size": 32, "mean": (0.5,) * 3, "std": (0.25,) * 3}
    enc = repdiag.encoder(module, "tiny")
    assert enc.source == "python" and enc.preprocess.input_size == 32
    spectra = repdiag.jacobian_spectra(enc, bench, config, layers=["final"])
    s = spectra["final"]["singular_values"]
    n = config["jacobians"]["probes"]["binding"]["n"]
    assert s.shape == (n, 6)  # 6 outputs: the exact spectrum, all of it
    # the engine's values against the Jacobian itself, for the first probe image
    from repdiag.binding.store import image_sets, open_binding_store

    x = enc.preprocess(image_sets(open_binding_store(bench))["query"][1][:1])
    full = torch.autograd.functional.jacobian(lambda v: enc.layer_outputs(v)["final"], x)
    expected = torch.linalg.svdvals(full.reshape(6, -1).double()).numpy()
    np.testing.assert_allclose(s[0], expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(spectra["final"]["jer"], jer(s, "pr").numpy())
