"""Control encoders through the real path (registry -> extraction -> metrics) on a rendered
binding dataset: the oracle at ceiling, the layout mask far above chance, every shape-blind,
position-blind or colour-only control at chance, for every readout and the Same/Different probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from repdiag.binding.controls import CONTROLS, build_control
from repdiag.binding.dataset import BindingSettings, render_binding_dataset
from repdiag.binding.metrics.model_metrics import compute_model_metrics
from repdiag.binding.metrics.options import MetricsSettings
from repdiag.binding.store import image_sets
from repdiag.core.errors import RegistryError
from repdiag.core.store import write_store
from repdiag.encoders import build_encoder
from repdiag.encoders.embeddings import extract_embeddings, write_embeddings

REPO = Path(__file__).resolve().parents[2]

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = pytest.mark.xdist_group("binding/test_controls")

CHANCE_CONTROLS = ("occupancy", "slot_area", "colour_histogram", "bag_of_shapes", "random_features")
# every readout and probe setting from the schema; L.Iso at its smallest k only (no test here
# reads it, and its four neighbourhood sizes were a fifth of the module's time)
SCHEMA_METRICS = MetricsSettings.from_config({"geometry": {"l_iso_k": [5]}})


@pytest.fixture(scope="module")
def dataset() -> BindingSettings:
    # the default geometry and pair count, fewer queries
    return render_binding_dataset(BindingSettings.from_config(dict(n_queries=256)))


@pytest.fixture(scope="module")
def control_metrics(dataset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("controls")
    store = write_store(root / "binding.zarr", dataset)
    results = {}
    for name in CONTROLS.names():
        entry = {"source": "python", "id": f"repdiag.binding.controls:{name}", "family": "control"}
        encoder = build_encoder(name, entry)
        embedded = extract_embeddings(encoder, image_sets(dataset), batch_size=512, device="cpu")
        path = write_embeddings(root / f"{name}.zarr", embedded)
        results[name] = compute_model_metrics(
            store, path, model=name, settings=SCHEMA_METRICS, seed=0
        )
    return results


def _final(result: dict) -> dict:
    return result["per_layer"]["final"]


def test_registry_names_every_control_once() -> None:
    assert set(CONTROLS.names()) == {
        "shape_oracle", "layout_mask", "occupancy", "slot_area", "colour_histogram",
        "bag_of_shapes", "random_features",
    }  # fmt: skip
    with pytest.raises(RegistryError, match="duplicate"):
        CONTROLS.add("occupancy", object)


def test_oracle_reads_every_slot_of_every_image(dataset) -> None:
    oracle = build_control("shape_oracle")
    for images, shapes in (
        (dataset["query_image"].values, dataset["query_shape"].values),
        (
            dataset["pair_image"].values.reshape(-1, 64, 64, 3),
            dataset["pair_shape"].values.reshape(-1, 4),
        ),
    ):
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
        with torch.no_grad():
            onehot = oracle(x).reshape(len(images), 4, 4).numpy()
        np.testing.assert_array_equal(onehot.argmax(-1), shapes)
        np.testing.assert_array_equal(onehot.sum(-1), 1)


def test_oracle_scores_the_ceiling(control_metrics: dict) -> None:
    final = _final(control_metrics["shape_oracle"])
    for name, readout in final["binding"].items():
        assert readout["accuracy"] == 1.0, name
        assert readout["win_rate"] == 1.0, name  # the continuous score's ceiling too
    assert final["same_different"]["accuracy"] >= 0.99


def test_layout_mask_binds_far_above_chance(control_metrics: dict) -> None:
    result = control_metrics["layout_mask"]
    final = _final(result)
    cosine = final["binding"]["cosine"]["accuracy"]
    for name, readout in final["binding"].items():
        assert readout["ci_low"] > result["chance"] + 0.3, name
    assert final["binding"]["knn"]["accuracy"] >= cosine - 0.05
    assert final["same_different"]["accuracy"] >= 0.9


@pytest.mark.parametrize("name", CHANCE_CONTROLS)
def test_blind_controls_sit_at_chance(control_metrics: dict, name: str) -> None:
    result = control_metrics[name]
    final = _final(result)
    scored = {k: v for k, v in final["binding"].items() if not v.get("skipped")}
    assert "cosine" in scored and "knn" in scored
    for readout, entry in scored.items():
        assert entry["ci_low"] <= result["chance"] <= entry["ci_high"], (readout, entry)
        # the win rate's closed-form value for an encoder that cannot tell candidates apart
        assert result["win_rate_chance"] == 0.5
        assert entry["win_rate_ci_low"] <= 0.5 <= entry["win_rate_ci_high"], (readout, entry)
    probe = final["same_different"]
    assert probe["ci_low"] <= 0.5 <= probe["ci_high"], probe


def test_geometry_does_not_order_the_controls_by_binding(control_metrics: dict) -> None:
    """The paper's point in miniature: random features are isotropic and do not bind; the
    anisotropic layout mask binds."""
    mask, noise = (_final(control_metrics[k]) for k in ("layout_mask", "random_features"))
    assert noise["geometry"]["g_iso"] > mask["geometry"]["g_iso"]
    assert noise["geometry"]["g_pr"] > mask["geometry"]["g_pr"]
    assert mask["binding"]["cosine"]["accuracy"] > noise["binding"]["cosine"]["accuracy"] + 0.3


def test_random_features_are_a_deterministic_function_of_the_image(dataset) -> None:
    control = build_control("random_features")
    x = torch.from_numpy(dataset["query_image"].values[:6]).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        alone = torch.cat([control(x[i : i + 1]) for i in range(6)])
        together = control(x)
        again = build_control("random_features")(x)
    torch.testing.assert_close(alone, together)
    torch.testing.assert_close(together, again)
    correlation = np.corrcoef(together.numpy())[np.triu_indices(6, 1)]
    assert np.abs(correlation).max() < 0.6  # distinct scenes, unrelated features


def test_controls_run_at_another_image_size() -> None:
    images = render_binding_dataset(
        BindingSettings.from_config(dict(image_size=96, n_queries=8, n_pairs=2))
    )
    x = torch.from_numpy(images["query_image"].values).permute(0, 3, 1, 2).float() / 255
    oracle = build_control("shape_oracle", image_size=96)
    assert oracle.preprocess_cfg["input_size"] == 96
    with torch.no_grad():
        onehot = oracle(x).reshape(8, 4, 4).numpy()
    np.testing.assert_array_equal(onehot.argmax(-1), images["query_shape"].values)


def test_controls_have_a_zero_jacobian_but_random_features_do_not(dataset) -> None:
    x = torch.from_numpy(dataset["query_image"].values[:2]).permute(0, 3, 1, 2).float() / 255
    for name in CONTROLS.names():
        control = build_control(name)
        jac = torch.autograd.functional.jacobian(lambda v, c=control: c(v).sum(0), x)
        if name == "random_features":
            assert jac.abs().max() > 0
        else:
            assert jac.abs().max() == 0, name


def test_python_source_reads_the_preprocessing_of_a_control(tmp_path: Path) -> None:
    encoder = build_encoder(
        "mask", {"source": "python", "id": "repdiag.binding.controls:layout_mask"}
    )
    assert encoder.preprocess.input_size == 64
    assert encoder.preprocess.mean == (0.0, 0.0, 0.0) and encoder.preprocess.std == (1.0, 1.0, 1.0)


def test_the_win_rate_orders_the_controls_as_accuracy_does(control_metrics: dict) -> None:
    """Monotone with accuracy on the controls: the oracle above the layout mask above every
    blind control, in both scores, for every readout; a blind control whose candidates are all
    identical sits at 1/2 exactly."""
    finals = {name: _final(result)["binding"] for name, result in control_metrics.items()}
    for readout in ("cosine", "knn", "local_pca"):
        ladder = [finals["shape_oracle"][readout], finals["layout_mask"][readout]]
        blind = [finals[name][readout] for name in CHANCE_CONTROLS]
        blind = [entry for entry in blind if not entry.get("skipped")]
        for score in ("accuracy", "win_rate"):
            assert ladder[0][score] >= ladder[1][score] > max(e[score] for e in blind), readout
    # bag_of_shapes sees which shapes are present, never where: every candidate is the same
    assert finals["bag_of_shapes"]["cosine"]["win_rate"] == 0.5
