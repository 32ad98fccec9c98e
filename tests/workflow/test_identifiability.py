"""The identifiability branch in the test workflow run: one cell of each kind, the tables, the
figures, and precise reruns (a cell depends only on the config values it uses)."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from repdiag.core.config import load_config
from repdiag.core.store import read_json
from repdiag.identifiability.report import PAPER_CLAIMS
from repdiag.identifiability.study import cell_names, parse_cell
from tests.planning import plan, wildcard_values

pytestmark = pytest.mark.workflow

RESULTS = Path("results")


def test_every_cell_writes_metrics_and_a_curve(workflow_run: Path) -> None:
    section = load_config(workflow_run / "config" / "test.yaml")["identifiability"]
    names = cell_names(section)
    kinds = {(c.sampling, c.encoder, c.loss) for c in map(parse_cell, names)}
    assert kinds == {
        ("full", "mlp", "infonce"),
        ("full", "inverse", "infonce"),
        ("restricted", "mlp", "infonce"),
        ("restricted", "inverse", "infonce"),
        ("restricted", "mlp", "support_corrected"),
    }
    every = section["train"]["log_every"]
    for name in names:
        inverse = parse_cell(name).encoder == "inverse"
        steps = section["encoders"]["inverse"]["steps"] if inverse else section["train"]["steps"]
        record = read_json(workflow_run / RESULTS / "identifiability" / f"{name}.json")
        assert record["cell"] == name and record["steps"] == steps
        assert record["params"]["train"]["batch_size"] == section["train"]["batch_size"]
        assert -1.0 <= record["metrics"]["r2"] <= 1.0 and 0.0 <= record["metrics"]["mcc"] <= 1.0
        assert 0.0 <= record["metrics"]["ape"] <= 2.0
        with open(workflow_run / RESULTS / "identifiability" / f"{name}.curve.csv") as stream:
            rows = list(csv.DictReader(stream))
        assert [int(r["step"]) for r in rows] == list(range(every, steps + 1, every))
        assert float(rows[-1]["loss"]) == pytest.approx(record["final_loss"], abs=1e-6)
        log = (workflow_run / "logs" / "identifiability_cell" / f"{name}.log").read_text()
        assert f"contrastive steps: {steps}/{steps}" in log


def test_tables_aggregate_the_cells_and_compare_with_the_paper(workflow_run: Path) -> None:
    section = load_config(workflow_run / "config" / "test.yaml")["identifiability"]
    table = pd.read_csv(workflow_run / RESULTS / "tables" / "identifiability.csv")
    assert len(table) == len(cell_names(section))  # one seed: one row per cell
    assert (table.n_seeds == 1).all() and table.r2_std.isna().all()
    cell = read_json(
        workflow_run / RESULTS / "identifiability" / "identity-full-mlp-infonce-s0.json"
    )
    row = table[(table.sampling == "full") & (table.encoder == "mlp")].iloc[0]
    assert row.r2_mean == pytest.approx(cell["metrics"]["r2"], rel=1e-5)
    corrected = table[table.loss == "support_corrected"]
    assert list(corrected.ratio) == section["ratio_sweep"]["ratios"]
    paper = pd.read_csv(workflow_run / RESULTS / "tables" / "identifiability_paper.csv")
    assert set(paper.claim) == {claim.claim_id for claim in PAPER_CLAIMS}
    overall = paper[paper.generator == "all"].set_index("claim")
    assert overall.loc["mlp_diversity", "n_cells"] == 1
    assert overall.loc["mlp_support_corrected", "n_cells"] == 0  # the test sweep has no ratio 1
    assert math.isnan(overall.loc["mlp_support_corrected", "measured_r2"])
    for stem in ("identifiability_r2", "identifiability_ratio"):
        for suffix, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):
            assert (
                (workflow_run / RESULTS / "figures" / f"{stem}.{suffix}")
                .read_bytes()
                .startswith(magic)
            )


def planned_cells(workdir: Path) -> list[str]:
    """The ``cell`` wildcard of every identifiability_cell job a dry run would execute."""
    return wildcard_values(plan(workdir), "identifiability_cell", "cell")


def test_changing_the_inverse_learning_rate_reruns_only_inverse_cells(
    workflow_run: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "run"
    shutil.copytree(workflow_run, workdir, symlinks=True)
    assert planned_cells(workdir) == []
    path = workdir / "config" / "test.yaml"
    config = yaml.safe_load(path.read_text())
    config["identifiability"].setdefault("encoders", {})["inverse"] = {"lr": 0.02}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    section = load_config(path)["identifiability"]
    assert planned_cells(workdir) == sorted(n for n in cell_names(section) if "-inverse-" in n)
