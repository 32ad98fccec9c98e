"""compute_metrics on config/test.yaml: one JSON per model, consistent with the stores it read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from repdiag.binding.metrics.readouts import binding_accuracy
from repdiag.core.store import open_store
from tests.conftest import REPO, copy_workflow
from tests.planning import PlanError, plan, rule_counts

pytestmark = pytest.mark.workflow


def _config(workdir: Path) -> dict:
    from repdiag.core.config import load_config

    return load_config(workdir / "config" / "test.yaml")


def _finite_numbers(node) -> list[float]:
    if isinstance(node, dict):
        return [v for child in node.values() for v in _finite_numbers(child)]
    if isinstance(node, list):
        return [v for child in node for v in _finite_numbers(child)]
    return [node] if isinstance(node, int | float) and not isinstance(node, bool) else []


def test_one_metrics_json_per_model(workflow_run: Path) -> None:
    config = _config(workflow_run)
    dataset = open_store(workflow_run / "results/datasets/binding.zarr")
    n_q, n_c, n_p = (dataset.sizes[d] for d in ("query", "candidate", "pair"))
    for model, entry in config["models"].items():
        path = workflow_run / "results" / "metrics" / f"{model}.json"
        result = json.loads(path.read_text())
        layers = [
            str(x)
            for x in open_store(workflow_run / f"results/embeddings/{model}.zarr")["layer"].values
        ]
        expected_layers = layers if config["metrics"]["layers"] == "all" else [layers[-1]]
        assert result["model"] == model
        assert (result["family"], result["source"]) == (entry["family"], entry["source"])
        assert result["config"] == {"metrics": config["metrics"], "seed": config["seed"]}
        assert result["chance"] == pytest.approx(1 / n_c)
        assert result["sizes"]["n_queries"] == n_q and result["sizes"]["n_pairs"] == n_p
        assert result["layers"] == expected_layers and set(result["per_layer"]) == set(
            expected_layers
        )
        assert all(np.isfinite(_finite_numbers(result)))
        for layer in expected_layers:
            values = result["per_layer"][layer]
            assert set(values["binding"]) == set(config["metrics"]["readouts"]["names"])
            for readout in values["binding"].values():
                assert readout["n"] == n_q
                assert readout["ci_low"] <= readout["accuracy"] <= readout["ci_high"]
            assert set(values["geometry"]["l_iso"]) == {
                str(k) for k in config["metrics"]["geometry"]["l_iso_k"]
            }
            probe = values["same_different"]
            assert probe["ci_low"] <= probe["accuracy"] <= probe["ci_high"]
            assert len(probe["fold_C"]) == config["metrics"]["probe"]["folds"]


def test_cosine_accuracy_matches_the_embedding_reader(workflow_run: Path) -> None:
    """An independent path: the encoder stage's reader and the public binding_accuracy."""
    from repdiag.encoders.embeddings import read_embeddings

    config = _config(workflow_run)
    model = next(iter(config["models"]))
    result = json.loads((workflow_run / "results" / "metrics" / f"{model}.json").read_text())
    layer = result["layers"][-1]
    store = workflow_run / f"results/embeddings/{model}.zarr"
    query = read_embeddings(store, layer, "query")
    candidate = read_embeddings(store, layer, "candidate")
    correct = open_store(workflow_run / "results/datasets/binding.zarr")["correct_index"].values
    expected = binding_accuracy(np.asarray(query), np.asarray(candidate), correct, "cosine")
    assert result["per_layer"][layer]["binding"]["cosine"]["accuracy"] == expected["accuracy"]


def _planned(workdir: Path, *targets: str) -> dict[str, int]:
    """Rule -> job count of a dry run for ``targets``."""
    return dict(rule_counts(plan(workdir, *targets)))


def test_a_metrics_option_reruns_only_the_metrics(workflow_run: Path, tmp_path: Path) -> None:
    workdir = shutil.copytree(workflow_run, tmp_path / "run", symlinks=True)
    path = workdir / "config" / "test.yaml"
    config = yaml.safe_load(path.read_text())
    config["metrics"]["readouts"]["knn"]["k"] += 1
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    models = _config(workdir)["models"]
    jobs = _planned(workdir, *(f"results/metrics/{model}.json" for model in models))
    assert jobs.get("compute_metrics") == len(models)
    upstream = {"render_binding", "train_zoo", "extract_embeddings", "jacobian_spectra"}
    assert not upstream & set(jobs), jobs


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ({"readouts": {"names": ["euclid"]}}, "euclid"),  # schema: not a readout
        ({"geometry": {"l_iso_k": [500]}}, "metrics.geometry.l_iso_k: k=500"),  # semantic check
    ],
)
def test_bad_metrics_config_fails_before_any_job(tmp_path: Path, metrics: dict, named: str) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["metrics"] = metrics
    (workdir / "config" / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(PlanError) as refused:
        plan(workdir, configfiles=["config/bad.yaml"])
    assert named in str(refused.value)
    assert not (workdir / "results").exists()
