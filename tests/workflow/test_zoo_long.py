"""config/zoo_long.yaml, the family comparison at a GPU budget: what it holds, its whole DAG planned
at full size, and the config run end to end at a tiny size (its keys and stages unchanged; sizes,
steps and runs cut)."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

from repdiag.core.config import load_config
from repdiag.core.store import read_json
from tests.conftest import REPO, copy_workflow, plan_in_process, snakemake
from tests.planning import tiny_config

CONFIG = REPO / "config" / "zoo_long.yaml"
OBJECTIVES = ("barlow_twins", "vicreg", "simmim", "dino", "simclr", "clip", "supervised")
TINY_STEPS = 3
# run end to end: one self-supervised objective, the least that passes every stage (8 jobs; each
# further run adds 4 jobs of a few seconds each, mostly imports). Every objective trains on this
# backbone in tests/encoders/zoo/test_learning.py, which also trains it for steps: 0 (the
# untrained control, random_resnet here; planned at full size below).
KEPT_RUNS = ("simclr_s0",)


def tiny(config: dict) -> dict:
    """``config`` at the test config's sizes (tests.planning.tiny_config: the benchmark, the
    Jacobians, the metrics and the statistics), KEPT_RUNS only, TINY_STEPS steps at batch 8 on
    a narrow backbone on the CPU; its keys and stages unchanged."""
    test = tiny_config()
    small = copy.deepcopy(config)
    small["datasets"]["binding"] = test["datasets"]["binding"]
    small.update({section: test[section] for section in ("jacobians", "metrics", "stats")})
    small["models"] = {key: small["models"][key] for key in KEPT_RUNS}
    zoo = small["zoo"]
    zoo.update(image_size=32, device="cpu", threads=1)
    zoo["backbones"]["resnet"]["timm_kwargs"] = {"channels": [8, 8, 16, 16], "stem_width": 8}
    zoo["objectives"] = {
        run: {**spec, "steps": min(spec["steps"], TINY_STEPS), "batch_size": 8}
        for run, spec in zoo["objectives"].items()
        if run in small["models"]
    }
    return small


def test_zoo_long_is_the_default_zoo_at_a_larger_budget() -> None:
    long, default = load_config(CONFIG), load_config(REPO / "config/config.yaml")
    runs = long["zoo"]["objectives"]
    for objective in OBJECTIVES:
        seeds = [run for run in runs if run in (f"{objective}_s{seed}" for seed in range(3))]
        assert len(seeds) == 3, objective
        for run in seeds:
            spec, base = runs[run], default["zoo"]["objectives"][f"{objective}_s0"]
            assert spec["objective"] == objective and spec["backbone"] == "resnet"
            assert spec["steps"] > base["steps"] and spec["batch_size"] > base["batch_size"]
            assert long["models"][run]["family"] == default["models"][f"{objective}_s0"]["family"]
    # same benchmark, scenes and backbone as the default: only the budget differs
    assert long["datasets"] == default["datasets"]
    assert long["zoo"]["scenes"] == default["zoo"]["scenes"]
    assert long["zoo"]["backbones"]["resnet"] == default["zoo"]["backbones"]["resnet"]
    controls = {k for k, m in default["models"].items() if m["family"] == "control"}
    assert controls <= set(long["models"])
    assert long["zoo"]["device"] == "auto"


def test_zoo_long_plans_every_run_at_its_full_size(tmp_path: Path) -> None:
    """The whole config, unchanged, through the Snakefile's checks to a DAG (nothing runs)."""
    workdir = copy_workflow(tmp_path / "wf")
    assert plan_in_process(workdir, workdir / "config" / "zoo_long.yaml") is None


@pytest.mark.workflow
@pytest.mark.xdist_group("workflow/test_zoo_long")
def test_zoo_long_runs_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    config = tiny(yaml.safe_load(CONFIG.read_text()))
    (workdir / "config" / "test.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # every stage up to the summary; the figures are the shared run's (tests/workflow/test_stats_workflow.py)
    snakemake(workdir, "results/summary.md")
    results = workdir / "results"
    models = pd.read_csv(results / "tables" / "models.csv")
    assert set(models["model"]) == set(config["models"])
    assert list(models["family"]) == ["contrastive"]  # the config's family, through the zoo run
    for run, spec in config["zoo"]["objectives"].items():
        meta = read_json(results / "zoo" / run / "meta.json")
        assert meta["steps_trained"] == spec["steps"], run
    assert "binding" in (results / "summary.md").read_text().lower()
