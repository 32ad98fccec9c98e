"""The statistics stage on config/test.yaml: every table and figure, consistent inputs, the report.

(Named test_stats_workflow.py, not test_stats.py: tests/ has no __init__.py files, so two test
modules with one basename cannot be collected in one session.)
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from repdiag.binding import APART_FAMILIES
from repdiag.binding.causal.options import causal_models
from repdiag.core.config import load_config
from repdiag.core.store import open_store
from tests.conftest import snakemake

pytestmark = pytest.mark.workflow

TABLES = (
    "models",
    "depth_profiles",
    "spectra",
    "correlations",
    "ols",
    "partial",
    "families",
    "robustness",
    "dose_series",
    "paper_comparison",
)
FIGURES = ("metric_scatter", "dose_series", "jacobian_spectra", "depth_profiles", "readouts")


def test_every_table_and_figure_is_written(workflow_run: Path) -> None:
    results = workflow_run / "results"
    for name in TABLES:
        table = pd.read_csv(results / "tables" / f"{name}.csv")
        assert len(table) > 0, name
    assert "binding ~ jer + same_different" in (results / "tables/ols_summary.txt").read_text()
    for name in FIGURES:
        image = mpimg.imread(results / "figures" / f"{name}.png")
        assert image.shape[0] > 300 and image.shape[1] > 300 and image[..., :3].std() > 0.05
        assert (results / "figures" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    summary = (results / "summary.md").read_text()
    assert (
        summary.startswith("# repdiag binding study: summary") and "## Paper comparison" in summary
    )


def test_models_table_matches_the_per_model_results(workflow_run: Path) -> None:
    config = load_config(workflow_run / "config" / "test.yaml")
    models = pd.read_csv(workflow_run / "results/tables/models.csv").set_index("model")
    causal = set(causal_models(config))  # built by binding_causal only
    assert list(models.index) == [key for key in config["models"] if key not in causal]
    for key, entry in config["models"].items():
        if key in causal:
            continue
        assert models.loc[key, "family"] == entry["family"]
        metrics = json.loads((workflow_run / f"results/metrics/{key}.json").read_text())
        final = metrics["per_layer"][metrics["final_layer"]]
        assert models.loc[key, "binding"] == pytest.approx(final["binding"]["cosine"]["accuracy"])
        assert models.loc[key, "same_different"] == pytest.approx(
            final["same_different"]["accuracy"]
        )
        store = open_store(workflow_run / f"results/jacobians/{key}.zarr")
        values = store["jer_pr"].transpose("layer", "image").values
        binding = np.asarray(store["probe_set"].values).astype(str) == "binding"
        layers = [str(x) for x in store["layer"].values]
        index = layers.index(metrics["final_layer"]) if metrics["final_layer"] in layers else -1
        if models.loc[key, "jacobian_zero"] == 1.0:  # a zero map: JER undefined, not 0
            assert np.isnan(models.loc[key, "jer"]) and not values[index, binding].any()
        else:
            assert models.loc[key, "jer"] == pytest.approx(values[index, binding].mean(), rel=1e-5)


def test_statistics_agree_with_the_models_table(workflow_run: Path) -> None:
    tables = workflow_run / "results/tables"
    models = pd.read_csv(tables / "models.csv")
    correlations = pd.read_csv(tables / "correlations.csv")
    correlations = correlations[correlations["models"] == "trained"].set_index("metric")
    comparison = pd.read_csv(tables / "paper_comparison.csv").set_index("claim")
    models = models[~models["family"].isin(APART_FAMILIES)]  # the dose run is kept apart
    n = len(models)
    assert comparison.loc["number of models", "run_value"] == n
    row = correlations.loc["jer"]
    if np.ptp(models["jer"]) > 0 and np.ptp(models["binding"]) > 0 and n >= 4:
        r = np.corrcoef(models["jer"], models["binding"])[0, 1]
        assert row["pearson_r"] == pytest.approx(r, abs=1e-8)
        assert comparison.loc["Pearson r(JER, binding accuracy)", "run_value"] == pytest.approx(r)
    else:  # tiny test encoders may all sit at chance: the table says why instead
        assert isinstance(row["note"], str) and row["note"]
    robustness = pd.read_csv(tables / "robustness.csv")
    assert {"l_iso", "geometry_rank", "jer_rank"} <= set(robustness["group"])


def test_report_builds(completed: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    snakemake(completed, "--report", str(target))
    html = target.read_text(errors="replace")
    assert target.stat().st_size > 10_000
    for name in (*FIGURES, "paper_comparison", "correlations", "summary"):
        assert name in html, name


def test_dose_series_models_carry_dose_and_step(workflow_run: Path) -> None:
    """The test config's dose run (slot labels at lambda 0.5, stopped at step 2 of 3) flows
    through extraction, Jacobians and metrics like any zoo run and forms the series with the
    presence run (lambda 0)."""
    models = pd.read_csv(workflow_run / "results/tables/models.csv").set_index("model")
    assert models.loc["dose", "family"] == "binding_dose"
    assert models.loc["dose", "dose"] == 0.5 and models.loc["dose", "step"] == 2
    assert models.loc["supervised", "dose"] == 0.0 and models.loc["supervised", "step"] == 3
    assert models["dose"].notna().sum() == 2  # every other model is outside the series
    assert np.isfinite(models.loc["dose", ["binding", "jer", "g_pr"]].astype(float)).all()
    series = pd.read_csv(workflow_run / "results/tables/dose_series.csv")
    assert set(series["n"]) == {2} and set(series["n_doses"]) == {2}
    assert set(series["unit"]) == {"training run (final network)"}
    # one seed: a slope, but no interval over seeds, and no fixed-effects fit (df 0)
    assert series["note"].str.contains("fewer than 2").all()
    assert series["ci_low"].isna().all()
    summary = (workflow_run / "results/summary.md").read_text()
    assert "## Binding dose series" in summary
    assert "2 training runs at 2 doses and 1 seeds" in summary
