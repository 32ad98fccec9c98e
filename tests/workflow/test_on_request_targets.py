"""The targets built on request only, on config/test.yaml: binding_causal (a raise, a sham and a
null arm against the plain run), binding_families (two objectives x two seeds through
the main study's statistics) and identifiability_check (the like-for-like cells), run once in a
copy of the shared workflow run (they are not part of `rule all`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import yaml

from repdiag.common.tables import read_table
from repdiag.core.config import fill_defaults
from repdiag.core.store import read_json
from repdiag.studies import final_outputs
from tests.conftest import copy_workflow, edit_config, snakemake
from tests.planning import plan, wildcard_values
from tests.shared_runs import build_shared, shared_root

pytestmark = pytest.mark.workflow
RESULTS = Path("results")


JER_SETTINGS = {"weight": 0.5, "images": 2, "probes": 1}


def add_jer_up(config: dict) -> None:
    """config/test.yaml (as read from YAML) plus binding_causal's path: the causal base `jer`,
    simclr's run at seed 0 with a plain arm (simclr itself), a raise, a direction-sham and a null
    arm (kept out of config/test.yaml, so `rule all` there is unchanged)."""
    raise_arm = {"jer_regulariser": dict(JER_SETTINGS)}
    sham_arm = {"jer_regulariser": {**JER_SETTINGS, "term": "direction_sham"}}
    null_arm = {"jer_regulariser": {"weight": 1e-9, "term": "global_pr"}}
    config.setdefault("series", {})["jer"] = {
        "name": "jer_{arm}_s{seed}",
        "family": "jer_intervention",
        "run": {**config["zoo"]["objectives"]["simclr"], "objective": "simclr"},
        "axes": {
            "arm": {
                "patches": {"plain": {}, "raise": raise_arm, "sham": sham_arm, "null": null_arm}
            },
            "seed": {"set": "seed", "values": [0]},
        },
        "existing": {"jer_plain_s0": "simclr"},
    }
    config["binding_causal"] = {"series": ["jer"], "calibration": {"every": 2}}


FAMILY_RUNS = ["simclr", "simclr_fam_s1", "supervised", "supervised_fam_s1"]
NEW_FAMILY_RUNS = ["simclr_fam_s1", "supervised_fam_s1"]


def add_families(config: dict) -> None:
    """binding_families' path: the series `fam`, simclr and supervised at the test zoo's budget,
    seeds 0 and 1 (the smallest grid with seeds nested in objectives); seed 0 of each is the
    shared run's own (the same settings), so two runs are trained."""
    config.setdefault("series", {})["fam"] = {
        "name": "{objective}_fam_s{seed}",
        "family": "contrastive",
        "run": {"backbone": "vit", "steps": 3, "batch_size": 8},
        "axes": {
            "objective": {
                "set": "objective",
                "values": ["simclr", "supervised"],
                "families": {"supervised": "supervised"},
            },
            "seed": {"set": "seed", "values": [0, 1]},
        },
        "existing": {"simclr_fam_s0": "simclr", "supervised_fam_s0": "supervised"},
    }
    config["binding_families"] = {"series": ["fam"]}


def add_replicate(config: dict) -> None:
    """binding_replicate's path: the test zoo's dose run drawn again at lambda 0 and its dose,
    seed 0, with the null push (planned by the targets test, not built: its rules are the main
    study's aggregation and statistics, and the comparison's unit tests cover the rest)."""
    dose = {
        k: v
        for k, v in config["zoo"]["objectives"]["dose"].items()
        if k not in ("stop_at", "save_at")
    }
    config.setdefault("series", {})["rep"] = {
        "name": "rep_{lambda}_s{seed}",
        "family": "jer_intervention",
        "run": {**dose, "jer_regulariser": {"weight": 1e-9, "term": "global_pr"}},
        "axes": {
            "lambda": {"set": "hparams.slot_weight", "values": [0.0, 0.5]},
            "seed": {"set": "seed", "values": [0]},
        },
    }
    config["binding_replicate"] = {"series": ["rep"]}


def add_on_request_paths(config: dict) -> None:
    add_jer_up(config)
    add_families(config)


def build_on_request(folder: Path) -> None:
    """The shared workflow run plus the `jer` base (add_jer_up), the `fam` series (add_families)
    and `snakemake binding_causal binding_families identifiability_check`: only the jobs those
    targets add (tests.shared_runs builds it once per pytest run)."""
    source = build_shared(folder.parent, "workflow_run")
    shutil.copytree(source, folder, symlinks=True, dirs_exist_ok=True)
    edit_config(folder, add_on_request_paths)
    snakemake(folder, "binding_causal", "binding_families", "identifiability_check")


@pytest.fixture(scope="session")
def on_request(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shared(shared_root(tmp_path_factory.getbasetemp()), "on_request")


@pytest.fixture
def extras(on_request: Path) -> Path:
    return on_request


def test_the_arms_are_compared_per_seed_against_plain_with_their_push(extras: Path) -> None:
    results = extras / "results" / "binding_causal"
    arms = read_table(results / "arms.csv")
    assert arms[["arm", "seed", "model"]].values.tolist() == [
        ["plain", 0, "simclr"],
        ["raise", 0, "jer_raise_s0"],
        ["sham", 0, "jer_sham_s0"],
        ["null", 0, "jer_null_s0"],
    ]
    finite = ["binding", "same_different", "jer", "pr_full", "pr2_full", "g_pr", "final_loss"]
    assert np.isfinite(arms[finite].astype(float)).all().all()
    meta = read_json(extras / "results" / "zoo" / "jer_sham_s0" / "meta.json")
    record = meta["jer_regulariser"]
    assert meta["family"] == "jer_intervention" and record["term"] == "direction_sham"
    assert record["steps_acted"] == 3 and record["push_norm"] > 0
    by_model = arms.set_index("model")
    assert by_model.loc["jer_sham_s0", "final_loss"] == pytest.approx(meta["final_loss_mean"])
    # the displacement read from the saved weights and push: the null arm's is the smallest
    assert by_model.loc["simclr", "distance"] == 0.0
    # (3 steps of a 1e-9 push may round to nothing: the unit tests show a null run moving)
    assert 0 <= by_model.loc["jer_null_s0", "distance"] < by_model.loc["jer_raise_s0", "distance"]
    assert by_model.loc["jer_raise_s0", "along_push"] > 0  # the raise run moved along its push
    assert (extras / "results" / "zoo" / "jer_raise_s0" / "push.safetensors").is_file()
    assert not (extras / "results" / "zoo" / "simclr" / "push.safetensors").exists()
    contrasts = read_table(results / "contrasts.csv")
    primary = contrasts[(contrasts["family"] == "primary") & (contrasts["metric"] == "binding")]
    assert sorted(primary["arm"]) == ["raise", "sham"] and set(primary["reference"]) == {"plain"}
    assert (primary["n"] == 1).all() and (primary["unit"] == "training run (seed)").all()
    up = primary.set_index("arm").loc["raise", "mean"]
    assert up == pytest.approx(
        by_model.loc["jer_raise_s0", "binding"] - by_model.loc["simclr", "binding"]
    )
    assert set(contrasts.loc[contrasts["family"] == "floor", "arm"]) == {"null"}
    checks = contrasts[contrasts["family"] == "manipulation"]
    assert {"jer", "pr_full", "pr2_full", "g_pr", "g_iso"} <= set(checks["metric"])
    displacement = read_table(results / "displacement.csv").set_index("arm")
    assert displacement.loc["raise", "along_push_vs_raise"] == pytest.approx(1.0)
    calibration = pd.read_csv(results / "calibration.csv")
    assert calibration["run"].tolist() == ["jer_raise_s0"] * 2
    assert set(calibration["term"]) == {"jer", "global_pr"}
    assert (calibration["share_per_unit_weight_median"] > 0).all()
    summary = (results / "summary.md").read_text()
    assert "Primary family" in summary and "training run (seed)" in summary
    image = mpimg.imread(extras / "results" / "figures" / "binding_causal.png")
    assert image.shape[0] > 200 and image.std() > 0


def test_the_main_study_leaves_the_regularised_models_out(workflow_run: Path, extras: Path) -> None:
    models = pd.read_csv(workflow_run / "results" / "tables" / "models.csv")
    assert "jer_raise_s0" not in set(models["model"]) and "simclr" in set(models["model"])
    assert not (workflow_run / "results" / "zoo" / "jer_raise_s0").exists()  # not in rule all
    causal = pd.read_csv(extras / "results" / "binding_causal" / "models.csv")
    assert sorted(causal["model"]) == ["jer_null_s0", "jer_raise_s0", "jer_sham_s0", "simclr"]


def test_binding_alone_plans_no_job_of_the_on_request_models(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    edit_config(workdir, add_on_request_paths)
    named = {value for job in plan(workdir, "binding") for value in job.wildcards.values()}
    assert "simclr" in named
    assert not {"jer_raise_s0", "jer_sham_s0", *NEW_FAMILY_RUNS} & named
    causal = plan(workdir, "binding_causal")
    assert "jer_raise_s0" in wildcard_values(causal, "train_zoo_pushed", "objective")
    families = plan(workdir, "binding_families")
    assert set(wildcard_values(families, "train_zoo", "objective")) == set(FAMILY_RUNS)
    assert set(wildcard_values(families, "compute_metrics", "model")) == set(FAMILY_RUNS)


def test_the_family_comparison_takes_the_objective_as_the_unit(extras: Path) -> None:
    results = extras / "results" / "binding_families"
    models = pd.read_csv(results / "models.csv")
    assert sorted(models["model"]) == FAMILY_RUNS  # config/test.yaml has no controls
    assert models.set_index("model")["family"].to_dict() == {
        "simclr": "contrastive",
        "simclr_fam_s1": "contrastive",
        "supervised": "supervised",
        "supervised_fam_s1": "supervised",
    }
    correlations = pd.read_csv(results / "correlations.csv")
    trained = correlations[correlations["models"] == "trained"]
    assert set(trained["unit"]) == {"objective (mean over its seeds)"}
    assert set(trained["n"]) == {2} and set(trained["n_runs"]) == {4}  # seeds nested
    families = pd.read_csv(results / "families.csv")
    binding = families[families["metric"] == "binding_cosine"].set_index("family")
    assert binding.loc["contrastive", "n_runs"] == 2
    assert binding.loc["supervised", "mean"] == pytest.approx(
        models[models["family"] == "supervised"]["binding_cosine"].mean()
    )
    # the table's binding column is the family comparison's score, as its tables say
    assert models["binding"].tolist() == models["binding_cosine_win"].tolist()
    primary = pd.read_csv(results / "primary.csv")  # the pre-registered family, win rate
    assert list(primary["metric"]) == ["jer", "g_pr"]
    assert set(primary["binding_score"]) == {"win_rate"} and set(primary["family_size"]) == {2}
    assert primary["pearson_r"].isna().all() and not primary["rejected"].any()  # 2 units
    assert (primary["note"].str.len() > 0).all()
    within = pd.read_csv(results / "within_run.csv")  # no saved steps in config/test.yaml
    assert "jer" in set(within["metric"]) and set(within["n_runs"]) == {0}
    assert within["note"].str.contains("0 runs with a saved step").all()
    summary = (results / "summary.md").read_text()
    assert "too few" in summary  # 2 objectives: the tables say so instead of giving numbers
    assert "## Pre-registered primary family" in summary and "## Within-run split" in summary
    assert "| win rate (primary) |" in summary and "accuracy (primary)" not in summary
    assert "| r(jer, win_rate) | 2 (" in summary and "no run has both here" in summary
    image = mpimg.imread(results / "metric_scatter.png")
    assert image.shape[0] > 200 and image.std() > 0


def test_the_main_study_leaves_the_family_runs_out(workflow_run: Path, extras: Path) -> None:
    models = pd.read_csv(workflow_run / "results" / "tables" / "models.csv")
    assert not set(NEW_FAMILY_RUNS) & set(models["model"])
    assert not (workflow_run / "results" / "zoo" / "simclr_fam_s1").exists()
    meta = read_json(extras / "results" / "zoo" / "supervised_fam_s1" / "meta.json")
    assert (meta["objective"], meta["seed"], meta["steps"]) == ("supervised", 1, 3)


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


def test_each_target_builds_its_final_outputs_and_every_rule_serves_one(tmp_path: Path) -> None:
    """Every target rule's inputs are repdiag.studies.final_outputs(config)[target]; each job's
    every output is read by another job, is a final output or is a record; and the targets together reach
    every rule the workflow defines, except the branches config/test.yaml leaves off."""
    workdir = copy_workflow(tmp_path / "wf")
    edit_config(workdir, lambda config: (add_on_request_paths(config), add_replicate(config)))
    config = fill_defaults(yaml.safe_load((workdir / "config" / "test.yaml").read_text()))
    outputs = final_outputs(config)
    rules: set[str] = set()
    jobs = plan(workdir, *outputs, forceall=True, rules=rules)
    by_rule = {job.rule: job for job in jobs}
    for name, paths in outputs.items():
        assert paths or name in {"cifar", "sugarcrepe"}, name
        assert sorted(by_rule[name].inputs) == sorted(paths), name
    read = {path for job in jobs for path in job.inputs}
    unread = {out for job in jobs for out in job.outputs if out not in read}
    # records kept for inspection: learning curves, the calibration's steps, Jacobian summaries
    records = {
        o for o in unread if o.endswith(("curve.csv", "calibration_steps.csv", "push.safetensors"))
    }
    records |= {o for o in unread if o.startswith("results/jacobians/") and o.endswith(".json")}
    # a run trained for its saved steps (save_at) keeps its own weights, which no model reads
    saving = {o for job in jobs if job.rule == "train_zoo_saving" for o in job.outputs}
    records |= {o for o in unread & saving if o.endswith("model.safetensors")}
    assert records and unread == records
    off = {rule for rule in rules if rule.startswith(("cifar_", "sugarcrepe_"))}
    assert off and rules - {job.rule for job in jobs} == off | {"all"}
