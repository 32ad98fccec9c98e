"""Per-model metrics from contract-shaped stores: structure, id alignment, options, bad stores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from repdiag.binding.analysis.aggregate import metrics_row
from repdiag.binding.metrics.geometry import geometry_metrics
from repdiag.binding.metrics.model_metrics import compute_model_metrics, select_layers
from repdiag.binding.metrics.options import MetricsSettings, ProbeSettings
from repdiag.binding.metrics.probes import PROBE_FIELDS, same_different_probe
from repdiag.binding.metrics.readouts import binding_accuracy
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import write_json, write_store

N_Q, N_C, N_P, DIMS = 12, 4, 10, {"block00": 6, "final": 5}


OPTIONS = {
    "reference": {"image_sets": ["pair"], "max_size": 100},
    "readouts": {"knn": {"k": 4}, "local_pca": {"k": 6, "dim": 2}},
    "geometry": {"l_iso_k": [3, 5]},
    "probe": {"folds": 2, "inner_folds": 2},
}
SETTINGS = MetricsSettings.from_config(OPTIONS)


def _labels(values) -> np.ndarray:
    """Strings as the stages store them (object dtype: zarr's variable-length strings)."""
    return np.array(list(values), dtype=object)


def _dataset(path: Path, correct: np.ndarray, same: np.ndarray) -> Path:
    """The arrays of results/datasets/binding.zarr that the metrics read (contract names)."""
    ds = xr.Dataset(
        {"correct_index": ("query", correct), "pair_same": ("pair", same.astype(np.int8))},
        coords={
            "query": _labels(f"q{i:05d}" for i in range(N_Q)),
            "candidate": np.arange(N_C),
            "pair": _labels(f"p{i:05d}" for i in range(N_P)),
        },
    )
    return write_store(path, ds)


def _embeddings(
    path: Path, features: dict[str, np.ndarray], order: np.ndarray | None = None
) -> Path:
    """An embedding store as docs/contracts.md describes it, images in ``order``."""
    ids = [f"query/q{i:05d}" for i in range(N_Q)]
    ids += [f"candidate/q{i:05d}/c{j}" for i in range(N_Q) for j in range(N_C)]
    ids += [f"pair/p{i:05d}/m{m}" for i in range(N_P) for m in (0, 1)]
    sets = ["query"] * N_Q + ["candidate"] * (N_Q * N_C) + ["pair"] * (2 * N_P)
    order = np.arange(len(ids)) if order is None else order
    data = {
        f"emb_{layer}": (("image", f"dim_{layer}"), values[order].astype(np.float32))
        for layer, values in features.items()
    }
    ds = xr.Dataset(
        data,
        coords={
            "image": _labels(ids)[order],
            "image_set": ("image", _labels(sets)[order]),
            "layer": _labels(features),
        },
        attrs={"model": "toy", "family": "other", "source": "python"},
    )
    return write_store(path, ds)


@pytest.fixture
def stores(tmp_path: Path) -> dict:
    rng = np.random.default_rng(0)
    n_images = N_Q + N_Q * N_C + 2 * N_P
    features = {layer: rng.normal(size=(n_images, d)) for layer, d in DIMS.items()}
    correct = rng.integers(0, N_C, size=N_Q)
    # In "final" the correct candidate is a noisy copy of its query: a sure cosine hit.
    for i in range(N_Q):
        row = N_Q + i * N_C + correct[i]
        features["final"][row] = features["final"][i] + 0.01 * rng.normal(size=DIMS["final"])
    same = np.tile([0, 1], N_P // 2)
    return {
        "dataset": _dataset(tmp_path / "binding.zarr", correct, same),
        "embeddings": _embeddings(tmp_path / "toy.zarr", features),
        "features": features,
        "correct": correct,
        "same": same,
        "n_images": n_images,
        "tmp": tmp_path,
    }


def _compute(stores: dict, embeddings: Path | None = None, **options) -> dict:
    return compute_model_metrics(
        stores["dataset"],
        embeddings or stores["embeddings"],
        model="toy",
        family="other",
        source="python",
        settings=MetricsSettings.from_config({**OPTIONS, **options}),
        seed=3,
    )


def test_structure_follows_the_contract(stores: dict) -> None:
    result = _compute(stores)
    assert result["model"] == "toy" and result["family"] == "other" and result["source"] == "python"
    assert result["chance"] == 1 / N_C
    assert result["sizes"] == {
        "n_queries": N_Q,
        "n_candidates": N_C,
        "n_pairs": N_P,
        "n_reference": 2 * N_P,
    }
    assert result["layers"] == ["block00", "final"] and result["final_layer"] == "final"
    assert result["config"]["seed"] == 3
    assert result["config"]["metrics"]["readouts"]["knn"] == {"k": 4, "weights": "similarity"}
    layer = result["per_layer"]["final"]
    assert set(layer) == {"geometry", "binding", "same_different"}
    assert set(layer["geometry"]) == {
        "g_pr",
        "g_iso",
        "l_iso",
        "effective_rank",
        "participation_ratio",
    }
    assert set(layer["geometry"]["l_iso"]) == {"3", "5"}
    assert set(layer["binding"]) == {"cosine", "knn", "local_pca"}
    assert {"accuracy", "ci_low", "ci_high", "n"} <= set(layer["binding"]["cosine"])
    assert set(layer["same_different"]) == set(PROBE_FIELDS)
    assert len(layer["same_different"]["fold_C"]) == 2
    assert layer["binding"]["cosine"]["accuracy"] == 1.0
    write_json(stores["tmp"] / "toy.json", result)  # JSON-serialisable, finite
    assert json.loads((stores["tmp"] / "toy.json").read_text()) == result


def test_values_match_direct_calls_on_aligned_arrays(stores: dict) -> None:
    result = _compute(stores)
    for layer, values in stores["features"].items():
        values = values.astype(np.float32).astype(np.float64)
        query = values[:N_Q]
        candidates = values[N_Q : N_Q + N_Q * N_C].reshape(N_Q, N_C, -1)
        pairs = values[N_Q + N_Q * N_C :].reshape(N_P, 2, -1)
        reference = values[N_Q + N_Q * N_C :]
        got = result["per_layer"][layer]
        geometry = geometry_metrics(reference, [3, 5])
        assert got["geometry"]["l_iso"] == pytest.approx(geometry.pop("l_iso"))
        assert {k: got["geometry"][k] for k in geometry} == pytest.approx(geometry)
        expected = binding_accuracy(
            query, candidates, stores["correct"], "local_pca", reference, k=6, dim=2
        )
        assert got["binding"]["local_pca"]["accuracy"] == expected["accuracy"]
        assert got["binding"]["local_pca"]["ci_high"] == pytest.approx(expected["ci_high"])
        settings = ProbeSettings.from_config({"folds": 2, "inner_folds": 2})
        probe = same_different_probe(pairs, stores["same"], settings, 3)
        assert got["same_different"] == {k: probe[k] for k in PROBE_FIELDS}


def test_stores_are_aligned_by_image_id_not_by_order(stores: dict) -> None:
    order = np.random.default_rng(1).permutation(stores["n_images"])
    shuffled = _embeddings(stores["tmp"] / "shuffled.zarr", stores["features"], order)
    assert _compute(stores, shuffled)["per_layer"] == _compute(stores)["per_layer"]


def test_final_layer_only(stores: dict) -> None:
    result = _compute(stores, layers="final")
    assert result["layers"] == ["final"] and list(result["per_layer"]) == ["final"]
    assert select_layers(["stage0", "stage1"], "final") == ["stage1"]


def test_reference_is_subsampled_with_the_seed(stores: dict) -> None:
    small = {"image_sets": ["query", "pair"], "max_size": 15}
    first = _compute(stores, reference=small)
    assert first["sizes"]["n_reference"] == 15
    assert _compute(stores, reference=small)["per_layer"] == first["per_layer"]


def test_non_finite_embeddings_are_rejected_naming_the_store(stores: dict) -> None:
    array = zarr.open_array(stores["embeddings"] / "emb_final", mode="r+")
    array[0, 0] = np.nan
    with pytest.raises(StoreError, match=r"toy\.zarr.*emb_final.*non-finite"):
        _compute(stores)


def test_mismatched_stores_are_rejected(stores: dict) -> None:
    keep = np.flatnonzero(np.arange(stores["n_images"]) != N_Q + 5)  # drop one candidate image
    broken = stores["tmp"] / "broken.zarr"
    write_store(broken, xr.open_zarr(stores["embeddings"]).load().isel(image=keep))
    with pytest.raises(StoreError, match=r"broken\.zarr has no image 'candidate/q00001/c1'"):
        _compute(stores, broken)


def test_bad_labels_are_rejected_naming_the_dataset(stores: dict) -> None:
    bad = _dataset(stores["tmp"] / "bad.zarr", np.full(N_Q, N_C), stores["same"])
    with pytest.raises(StoreError, match=r"bad\.zarr.*correct_index"):
        compute_model_metrics(bad, stores["embeddings"], model="toy", settings=SETTINGS, seed=0)


def test_missing_reference_set_and_too_small_reference(stores: dict) -> None:
    with pytest.raises(StoreError, match=r"no images of set \['folder'\]"):
        _compute(stores, reference={"image_sets": ["folder"]})
    with pytest.raises(ConfigError, match=r"metrics\.geometry\.l_iso_k: k=5"):
        _compute(stores, reference={"image_sets": ["pair"], "max_size": 5})


def test_too_many_folds_for_the_pairs_is_named(stores: dict) -> None:
    with pytest.raises(ConfigError, match=r"metrics\.probe\.folds=6 exceeds the 5 pairs"):
        _compute(stores, probe={"folds": 6})


def test_inapplicable_readout_is_skipped_for_that_layer_only(stores: dict) -> None:
    """A 4-dim layer cannot hold local_pca's dim=5: that entry is skipped, nothing else."""
    rng = np.random.default_rng(5)
    features = {"narrow": rng.normal(size=(stores["n_images"], 4)), **stores["features"]}
    store = _embeddings(stores["tmp"] / "narrow.zarr", features)
    readouts = {"knn": {"k": 4}, "local_pca": {"k": 20, "dim": 5}}  # 20 reference embeddings
    result = _compute(stores, store, readouts=readouts)
    skipped = result["per_layer"]["narrow"]["binding"]["local_pca"]
    assert skipped == {
        "accuracy": None,
        "ci_low": None,
        "ci_high": None,
        "n": N_Q,
        "hits": None,
        "ci_method": "wilson",
        "win_rate": None,
        "win_rate_ci_low": None,
        "win_rate_ci_high": None,
        "skipped": True,
        "note": "local_pca needs dim=5 <= embedding width 4; skipped for this layer",
    }
    assert result["per_layer"]["narrow"]["binding"]["knn"]["skipped"] is False
    assert result["per_layer"]["narrow"]["binding"]["cosine"]["accuracy"] is not None
    for layer in ("block00", "final"):  # 6 and 5 dims: local_pca applies
        entry = result["per_layer"][layer]["binding"]["local_pca"]
        assert entry["skipped"] is False and 0 <= entry["accuracy"] <= 1
    write_json(stores["tmp"] / "narrow.json", result)  # null, not NaN: still valid JSON
    # Downstream the skipped entry becomes NaN plus its note, never a KeyError.
    row = metrics_row({**result, "final_layer": "narrow"})
    assert math.isnan(row["binding_local_pca"]) and math.isnan(row["binding_local_pca_ci_low"])
    assert row["note"] == f"binding_local_pca: {skipped['note']}"
    assert np.isfinite(row["binding_cosine"]) and metrics_row(result)["note"] == ""


def test_readout_k_above_the_reference_size_is_skipped_not_fatal(stores: dict) -> None:
    result = _compute(stores, readouts={"knn": {"k": 21}, "local_pca": {"k": 6, "dim": 2}})
    for layer in ("block00", "final"):
        binding = result["per_layer"][layer]["binding"]
        assert binding["knn"]["skipped"] and binding["knn"]["accuracy"] is None
        assert (
            binding["knn"]["note"] == "knn needs k=21 <= reference size 20; skipped for this layer"
        )
        assert not binding["local_pca"]["skipped"] and not binding["cosine"]["skipped"]


def test_binding_hits_carry_tie_credit(stores: dict) -> None:
    """A constant layer ties every candidate: each readout scores exactly chance, hits = n / n_c."""
    features = {"flat": np.ones((stores["n_images"], 6)), **stores["features"]}
    store = _embeddings(stores["tmp"] / "flat.zarr", features)
    for name, entry in _compute(stores, store)["per_layer"]["flat"]["binding"].items():
        assert entry["accuracy"] == pytest.approx(1 / N_C, rel=1e-12), name
        assert entry["hits"] == pytest.approx(N_Q / N_C, rel=1e-12), name
        assert entry["ci_low"] < 1 / N_C < entry["ci_high"], name


def test_family_and_source_default_to_the_store_attrs(stores: dict) -> None:
    result = compute_model_metrics(
        stores["dataset"], stores["embeddings"], model="toy", settings=SETTINGS, seed=0
    )
    assert (result["family"], result["source"]) == ("other", "python")


def test_missing_store_is_named(stores: dict) -> None:
    with pytest.raises(StoreError, match=r"nothing\.zarr does not exist"):
        _compute(stores, stores["tmp"] / "nothing.zarr")
