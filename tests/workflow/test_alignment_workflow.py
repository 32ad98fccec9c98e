"""The alignment branch on config/test.yaml: one JSON per grid cell, real pair, tables, figures.

(Named ``test_alignment_workflow`` because ``tests/alignment/test_metrics.py`` exists and the
test folders are not packages.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repdiag.alignment.grid import grid_cells, real_pairs
from repdiag.alignment.report import CLAIMS

pytestmark = pytest.mark.workflow


def _alignment(workdir: Path) -> dict:
    from repdiag.core.config import load_config

    return load_config(workdir / "config" / "test.yaml")["alignment"]


def test_one_json_per_cell_with_finite_metrics(workflow_run: Path) -> None:
    alignment = _alignment(workflow_run)
    cells = grid_cells(alignment)
    assert cells
    for name, spec in cells.items():
        record = json.loads((workflow_run / "results" / "alignment" / f"{name}.json").read_text())
        assert record["cell"] == name and record["variant"] == spec["variant"]
        n_train = alignment["synthetic"]["n_train"]
        expected_pairs = (
            0 if spec["paired_fraction"] == 0 else max(1, round(spec["paired_fraction"] * n_train))
        )
        assert record["n_paired"] == expected_pairs
        summary = record["summary"]
        for key in ("explained_variance", "mcc", "tr_r2", "jaccard", "probe_transfer", "cycle_r2"):
            assert np.isfinite(summary[key]), (name, key)
        assert 0 <= summary["l0"] <= alignment["sae"]["k"]
        assert -1 <= summary["code_correlation"] <= 1 and 0 <= summary["jaccard"] <= 1
        assert record["train"]["curve"][-1]["step"] == alignment["train"]["steps"]


def test_real_pair_reads_both_embedding_stores(workflow_run: Path) -> None:
    alignment = _alignment(workflow_run)
    seeds = alignment["real"]["seeds"]
    bar = alignment["real"]["decodable_accuracy"]
    for name, pair in real_pairs(alignment).items():
        record = json.loads((workflow_run / "results/alignment/real" / f"{name}.json").read_text())
        assert (record["a"], record["b"]) == (pair["a"], pair["b"])
        assert record["seeds"] == seeds and {r["seed"] for r in record["runs"]} == set(seeds)
        variants = {run["variant"] for run in record["runs"]}
        # a control pair adds the exact translator, each metric's ceiling on the embeddings
        exact = {"exact-translator"} if pair.get("control", "none") != "none" else set()
        assert variants == set(alignment["real"]["variants"]) | exact
        for ceiling in (r for r in record["runs"] if r["variant"] == "exact-translator"):
            assert ceiling["summary"]["jaccard"] == pytest.approx(1.0)
            if ceiling["summary"]["tr_intervention"] is not None:
                assert ceiling["summary"]["tr_intervention"] == pytest.approx(1.0, abs=1e-3)
        assert [info["seed"] for info in record["data_info"]] == seeds
        scored = {}
        for info in record["data_info"]:
            assert info["n_common_images"] >= 16 and info["n_test"] >= 8 and info["n_fit"] > 0
            # the known attributes of the binding images: shape x slot (2x2 grid, 4 shapes)
            assert len(info["attributes"]) == 16 and info["n_without_attributes"] == 0
            # scored: decodable by both encoders' probes, cross-fitted on the training images
            for attribute in info["attributes"].values():
                accuracy = [a if a is not None else 0.0 for a in attribute["fit_accuracy"]]
                assert attribute["scored"] == (min(accuracy) >= bar)
            scored[info["seed"]] = any(a["scored"] for a in info["attributes"].values())
        for run in record["runs"]:
            summary = run["summary"]
            assert summary["mcc"] is None  # attributes are not the embeddings' generative factors
            assert 0.0 <= summary["attribute_probe_accuracy"] <= 1.0
            for key in ("tr_intervention", "cont_intervention", "tr_intervention_input"):
                assert (summary[key] is None) != scored[run["seed"]], key
                assert summary[key] is None or -1.0 <= summary[key] <= 1.0, key
            assert np.isfinite(run["summary"]["tr_r2"])
            low, high = run["intervals"]["tr_r2"]
            assert low <= high
        assert {g["n_seeds"] for g in record["seed_intervals"]} == {len(seeds)}


def test_tables_and_claims(workflow_run: Path) -> None:
    alignment = _alignment(workflow_run)
    tables = workflow_run / "results" / "tables"
    table = pd.read_csv(tables / "alignment.csv")
    synthetic = table[table["data"] == "synthetic"]
    assert sorted(synthetic["cell"]) == sorted(grid_cells(alignment))
    n_real = sum(
        len(alignment["real"]["paired_fractions"])
        if v not in ("independent", "cosae-distributional")
        else 1
        for v in alignment["real"]["variants"]
    )
    n_controls = sum(p.get("control", "none") != "none" for p in alignment["real"]["pairs"])
    n_pairs = len(alignment["real"]["pairs"])
    n_seeds = len(alignment["real"]["seeds"])
    # + the exact translators, at every seed
    assert (table["data"] == "real").sum() == (n_real * n_pairs + n_controls) * n_seeds
    assert {"tr_r2_ci_low", "tr_r2_ci_high"} <= set(table.columns)
    summary = pd.read_csv(tables / "alignment_summary.csv")
    assert {"tr_r2", "tr_r2_std", "tr_r2_min", "tr_r2_max", "n_seeds"} <= set(summary.columns)
    assert {"tr_r2_ci_low", "tr_intervention_exact"} <= set(summary.columns)
    claims = pd.read_csv(tables / "alignment_claims.csv")
    synthetic_claims = claims[claims["scope"] == "synthetic"]
    assert list(synthetic_claims["claim_id"]) == list(CLAIMS.ids)
    assert set(claims["verdict"]) <= {"supported", "not supported", "mixed", "not tested"}
    assert claims["evidence"].str.len().min() > 10


def test_figures(workflow_run: Path) -> None:
    figures = workflow_run / "results" / "figures"
    for stem in ("alignment_methods", "alignment_paired_fraction", "alignment_real"):
        png, pdf = figures / f"{stem}.png", figures / f"{stem}.pdf"
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
        assert pdf.read_bytes()[:4] == b"%PDF"
