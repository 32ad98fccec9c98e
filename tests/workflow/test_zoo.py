"""The zoo stage in the test workflow run: every objective trained, reloadable, plotted, and fed
into embedding extraction; one run's settings rerun only that run."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.core.config import load_config
from repdiag.core.store import open_store, read_json
from repdiag.encoders.zoo.checkpoint import load_zoo_model
from repdiag.encoders.zoo.plot import read_curve
from repdiag.encoders.zoo.spec import FAMILIES, run_family, saving_runs, trained_runs, zoo_runs
from tests.conftest import edit_config
from tests.planning import plan, wildcard_values

pytestmark = pytest.mark.workflow


def test_every_objective_is_trained_and_reloads(workflow_run: Path) -> None:
    config = load_config(workflow_run / "config" / "test.yaml")
    runs = zoo_runs(config)
    # config/test.yaml keeps the objectives whose outputs workflow tests read; every objective
    # trains in tests/encoders/zoo/test_learning.py
    objectives = {config["zoo"]["objectives"][r]["objective"] or r for r in runs}
    assert objectives == {"barlow_twins", "mae", "simclr", "clip", "supervised"}
    assert objectives < set(FAMILIES)
    for run in runs:
        run_dir = workflow_run / "results" / "zoo" / run
        meta = read_json(run_dir / "meta.json")
        entry = config["zoo"]["objectives"][run]
        stop_at = entry.get("stop_at")
        steps = entry["steps"] if stop_at is None else stop_at  # a checkpoint of its schedule
        assert meta["steps_trained"] == steps
        assert (
            meta["steps"] == entry["steps"]
            and meta["batch_size"] == config["zoo"]["objectives"][run]["batch_size"]
        )
        assert meta["preprocess"]["input_size"] == config["zoo"]["image_size"]
        losses = read_curve(run_dir / "curve.csv")
        assert len(losses) == steps and meta["final_loss"] == losses[-1]
        model = load_zoo_model(run_dir, "cpu")
        assert model.meta["family"] == run_family(run, entry, config["zoo"]["hparams"])
        assert (model.head is None) == (meta["objective"] == "mae")
        # a saved step (save_at) is logged by the run that trained it
        trained = entry.get("saved_by") or run
        log = (workflow_run / "logs" / "train_zoo" / f"{trained}.log").read_text()
        done = config["zoo"]["objectives"][trained]["steps"]
        assert f"train_zoo {trained} ({meta['objective']}): {done}/{done}" in log  # Progress
    for suffix, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):
        assert (
            (workflow_run / "results" / "figures" / f"zoo_curves.{suffix}")
            .read_bytes()
            .startswith(magic)
        )


def test_zoo_models_flow_into_embedding_extraction(workflow_run: Path) -> None:
    config = load_config(workflow_run / "config" / "test.yaml")
    zoo_models = [key for key, entry in config["models"].items() if entry["source"] == "zoo"]
    assert len(zoo_models) == len(zoo_runs(config))  # every trained run is extracted
    for key in zoo_models:
        store = open_store(workflow_run / "results" / "embeddings" / f"{key}.zarr")
        assert "final" in [str(v) for v in store["layer"].values], key
        meta = read_json(
            workflow_run / "results" / "zoo" / config["models"][key]["id"] / "meta.json"
        )
        assert store["emb_final"].shape[1] == meta["feature_dim"]


def planned_zoo_runs(workdir: Path) -> list[str]:
    """The ``objective`` wildcard of every train_zoo job a dry run would execute."""
    return wildcard_values(plan(workdir), "train_zoo", "objective")


def test_one_objectives_settings_rerun_only_that_run(completed: Path) -> None:
    assert planned_zoo_runs(completed) == []
    edit_config(completed, lambda c: c["zoo"]["hparams"]["mae"].update(mask_ratio=0.5))
    assert planned_zoo_runs(completed) == ["mae"]


def test_the_scene_stream_is_shared_by_every_run(completed: Path) -> None:
    edit_config(completed, lambda c: c["zoo"]["scenes"].update(seed=7))
    config = load_config(completed / "config" / "test.yaml")
    trained = trained_runs(config)  # dose-step2 is saved by dose: dose retrains, once
    assert planned_zoo_runs(completed) == [r for r in trained if r not in saving_runs(config)]
    assert wildcard_values(plan(completed), "train_zoo_saving", "objective") == ["dose"]
