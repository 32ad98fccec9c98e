"""The targets built on request only, on config/test.yaml: binding_causal (a regularised run
against its plain run) and identifiability_check (the like-for-like cells), run once in a copy
of the shared workflow run (they are not part of `rule all`)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from repdiag.core.store import read_json
from tests.conftest import copy_workflow, edit_config, snakemake
from tests.shared_runs import build_shared, shared_root

pytestmark = pytest.mark.workflow
RESULTS = Path("results")


def add_jer_up(config: dict) -> None:
    """config/test.yaml plus binding_causal's path: `jer_up`, simclr with a JER regulariser,
    compared with `simclr` (kept out of config/test.yaml, so `rule all` there is unchanged)."""
    config["models"]["jer_up"] = {"source": "zoo", "id": "jer_up", "family": "jer_intervention"}
    config["zoo"]["objectives"]["jer_up"] = {
        **config["zoo"]["objectives"]["simclr"],
        "objective": "simclr",
        "jer_regulariser": {"weight": 0.5, "images": 2, "probes": 1},
    }
    config["binding_causal"] = {"comparisons": {"jer_up": "simclr"}}


def build_on_request(folder: Path) -> None:
    """The shared workflow run plus `jer_up` and `snakemake binding_causal
    identifiability_check`: only the jobs those targets add (tests.shared_runs builds it once
    per pytest run)."""
    source = build_shared(folder.parent, "workflow_run")
    shutil.copytree(source, folder, symlinks=True, dirs_exist_ok=True)
    edit_config(folder, add_jer_up)
    snakemake(folder, "binding_causal", "identifiability_check")


@pytest.fixture(scope="session")
def on_request(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shared(shared_root(tmp_path_factory.getbasetemp()), "on_request")


@pytest.fixture
def extras(on_request: Path) -> Path:
    return on_request


def test_the_regularised_run_is_compared_with_its_plain_run(extras: Path) -> None:
    results = extras / "results"
    effects = pd.read_csv(results / "binding_causal" / "effects.csv")
    assert effects[["model", "baseline"]].values.tolist() == [["jer_up", "simclr"]]
    row = effects.iloc[0]
    assert row["weight"] == 0.5 and row["objective"] == "contrastive" and row["n_images"] == 2
    finite = ["jer_baseline", "jer", "jer_delta", "binding_cosine_delta", "same_different_delta"]
    assert np.isfinite(row[finite].astype(float)).all()
    # the check reads the engine's store, not the training estimate
    meta = read_json(results / "zoo" / "jer_up" / "meta.json")
    assert meta["family"] == "jer_intervention" and meta["jer_regulariser"]["weight"] == 0.5
    assert row["estimate_last_mean"] == pytest.approx(meta["jer_regulariser"]["estimate_last_mean"])
    assert row["estimate_last_mean"] != pytest.approx(row["jer"])
    summary = (results / "binding_causal" / "summary.md").read_text()
    assert "| jer_up | simclr |" in summary and "Manipulation check" in summary
    image = mpimg.imread(results / "figures" / "binding_causal.png")
    assert image.shape[0] > 200 and image.std() > 0


def test_the_main_study_leaves_the_regularised_models_out(workflow_run: Path, extras: Path) -> None:
    models = pd.read_csv(workflow_run / "results" / "tables" / "models.csv")
    assert "jer_up" not in set(models["model"]) and "simclr" in set(models["model"])
    assert not (workflow_run / "results" / "zoo" / "jer_up").exists()  # not part of rule all
    causal = pd.read_csv(extras / "results" / "binding_causal" / "models.csv")
    assert sorted(causal["model"]) == ["jer_up", "simclr"]


def test_binding_alone_plans_no_job_of_the_regularised_model(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    edit_config(workdir, add_jer_up)
    out = snakemake(workdir, "-n", "binding")
    planned = out.stdout + out.stderr
    assert re.search(r"wildcards: .*(model|objective)=simclr\b", planned)
    assert "jer_up" not in planned
    causal = snakemake(workdir, "-n", "binding_causal")
    assert "objective=jer_up" in causal.stdout + causal.stderr


def test_the_like_for_like_check_runs_its_own_cells(extras: Path) -> None:
    """config/test.yaml's check: identity, two seeds, batch 32, in results/identifiability_check."""
    seeds = pd.read_csv(extras / RESULTS / "tables" / "identifiability_check.csv")
    assert seeds[["generator", "seed", "batch_size", "steps"]].values.tolist() == [
        ["identity", 0, 32, 20],
        ["identity", 1, 32, 20],
    ]
    assert seeds["authors_r2"].tolist() == pytest.approx([0.0498103, 0.1164936], abs=1e-6)
    assert ((seeds["r2"] >= 0) & (seeds["r2"] <= 1)).all()
    assert (seeds["z1_lost"] == (seeds["r2_z1"] < 0.5)).all()
    claims = pd.read_csv(extras / RESULTS / "tables" / "identifiability_check_claims.csv")
    assert claims["generator"].tolist() == ["identity"] and claims["n_authors"].tolist() == [5]
    cells = sorted(p.name for p in (extras / RESULTS / "identifiability_check").glob("*.json"))
    assert cells == [
        "identity-restricted-mlp-infonce-s0.json",
        "identity-restricted-mlp-infonce-s1.json",
    ]
