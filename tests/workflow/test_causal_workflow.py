"""The binding_causal target on config/test.yaml: a regularised run against its plain run."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from repdiag.core.store import read_json
from tests.conftest import copy_workflow, snakemake

pytestmark = pytest.mark.workflow


def test_the_regularised_run_is_compared_with_its_plain_run(workflow_run: Path) -> None:
    results = workflow_run / "results"
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


def test_the_main_study_leaves_the_regularised_models_out(workflow_run: Path) -> None:
    models = pd.read_csv(workflow_run / "results" / "tables" / "models.csv")
    assert "jer_up" not in set(models["model"]) and "simclr" in set(models["model"])
    causal = pd.read_csv(workflow_run / "results" / "binding_causal" / "models.csv")
    assert sorted(causal["model"]) == ["jer_up", "simclr"]


def test_binding_alone_plans_no_job_of_the_regularised_model(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    out = snakemake(workdir, "-n", "binding")
    planned = out.stdout + out.stderr
    assert re.search(r"wildcards: .*(model|objective)=simclr\b", planned)
    assert "jer_up" not in planned
    causal = snakemake(workdir, "-n", "binding_causal")
    assert "objective=jer_up" in causal.stdout + causal.stderr
