"""The SugarCrepe rules on a fixture in the real format: tiny random-weight open_clip models
scored end to end, the tables, the partial correlation and the figure, in a temporary workflow copy.

(config/test.yaml keeps SugarCrepe disabled, since its data cannot be downloaded here: this test
writes its own config over the copy's config/test.yaml.)
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import yaml

from repdiag.common.intervals import wilson_interval
from repdiag.sugarcrepe.data import CATEGORIES
from tests.conftest import REPO, copy_workflow, snakemake
from tests.planning import plan, rule_counts
from tests.sugarcrepe.fixture import make_sugarcrepe

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = [pytest.mark.workflow, pytest.mark.xdist_group("workflow/test_sugarcrepe")]

# ViT-S-32-alt shrunk through the entry's kwargs (open_clip's model_kwargs): seconds per job
TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
# Two models keep the run short (each job mostly imports torch); the statistics need >= 4 and 5
# models, so here they carry notes: tests/sugarcrepe/test_sugarcrepe_report.py checks the numbers.
ZERO_SHOT = {"clip_a": 0.30, "clip_b": 0.45}
TARGETS = (
    "results/tables/sugarcrepe.csv",
    "results/tables/sugarcrepe_partial.csv",
    "results/figures/sugarcrepe_jer.png",
    "results/figures/sugarcrepe_jer.pdf",
)


def tiny_config(data: Path) -> dict:
    models = {}
    for i, (key, zero_shot) in enumerate(ZERO_SHOT.items()):
        kwargs = json.loads(json.dumps(TINY))
        kwargs["vision_cfg"]["width"] = 16 * (i + 1)
        models[key] = {
            "source": "open_clip",
            "id": "ViT-S-32-alt",
            "family": "vision_language",
            "kwargs": kwargs,
            "covariates": {"zero_shot_accuracy": zero_shot},
        }
    base = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    return {
        "seed": 0,
        "datasets": base["datasets"],
        "metrics": base["metrics"],
        "alignment": {"real": {"pairs": []}},  # its default pairs name the zoo models
        "models": models,
        "jacobians": {
            "k": 4,
            "power_iters": 1,
            "chunk_size": 2,
            "probes": {"binding": {"n": 0}, "noise": {"n": 2}},
        },
        "stats": {"n_bootstrap": 200, "probe_set": "noise"},
        "sugarcrepe": {
            "enabled": True,
            "root": str(data / "sugarcrepe"),
            "images": str(data / "val2017"),
            "max_per_category": 2,
            "batch_size": 8,
        },
    }


@pytest.fixture(scope="module")
def sugarcrepe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("sugarcrepe_workflow"))
    make_sugarcrepe(workdir / "data", n_images=6, per_category=3)
    (workdir / "config" / "test.yaml").write_text(yaml.safe_dump(tiny_config(workdir / "data")))
    snakemake(workdir, *TARGETS, "--set-threads", "sugarcrepe_score=1", "jacobian_spectra=1")
    return workdir


def test_every_model_is_scored_on_the_fixture(sugarcrepe_run: Path) -> None:
    for key in ZERO_SHOT:
        result = json.loads((sugarcrepe_run / f"results/sugarcrepe/{key}.json").read_text())
        assert list(result["categories"]) == list(CATEGORIES)
        assert result["n_examples"] == 14 and result["overall"]["n"] == 14  # max_per_category 2
        for record in result["categories"].values():
            assert record["n"] == 2
            assert (record["ci_low"], record["ci_high"]) == pytest.approx(
                wilson_interval(record["hits"], 2)
            )
        # the rule leaves the covariates out (changing one reruns no model): the tables add them
        assert result["zero_shot"] == {"accuracy": None, "source": "missing", "config_value": None}
        assert result["provenance"]["config"]["sugarcrepe"]["max_per_category"] == 2
        assert (sugarcrepe_run / f"logs/sugarcrepe_score/{key}.log").read_text().count(
            "SugarCrepe overall"
        ) == 1


def test_tables_join_accuracy_jer_and_zero_shot(sugarcrepe_run: Path) -> None:
    table = pd.read_csv(sugarcrepe_run / "results/tables/sugarcrepe.csv")
    assert list(table.columns[:7]) == [
        "model",
        "category",
        "accuracy",
        "ci_low",
        "ci_high",
        "n",
        "zero_shot_accuracy",
    ]
    assert len(table) == len(ZERO_SHOT) * (len(CATEGORIES) + 2)
    for key in ZERO_SHOT:
        rows = table[table["model"] == key].set_index("category")
        result = json.loads((sugarcrepe_run / f"results/sugarcrepe/{key}.json").read_text())
        assert rows.loc["overall", "accuracy"] == pytest.approx(result["overall"]["accuracy"])
        assert rows.loc["macro", "accuracy"] == pytest.approx(
            np.mean([result["categories"][c]["accuracy"] for c in CATEGORIES])
        )
        assert (rows["zero_shot_accuracy"] == ZERO_SHOT[key]).all()
        assert (rows["zero_shot_source"] == "config").all()
        summary = json.loads((sugarcrepe_run / f"results/jacobians/{key}.json").read_text())
        jer = summary["depth_profile"]["final"]["noise"]["pr"]["mean"]
        assert rows["jer"].iloc[0] == pytest.approx(jer, rel=1e-5)
    partial = pd.read_csv(sugarcrepe_run / "results/tables/sugarcrepe_partial.csv")
    partial["controls"] = partial["controls"].fillna("")
    assert list(partial["category"].unique()) == ["macro", "overall", *CATEGORIES]
    assert list(partial["controls"][:2]) == ["", "zero_shot_accuracy"]
    assert (partial["n"] == 2).all() and partial["r"].isna().all()
    assert partial["note"].str.contains("too few models").all()


def test_figure_is_written(sugarcrepe_run: Path) -> None:
    image = mpimg.imread(sugarcrepe_run / "results/figures/sugarcrepe_jer.png")
    assert image.shape[:2] == (660, 1500) and image[..., :3].std() > 0.05
    assert (sugarcrepe_run / "results/figures/sugarcrepe_jer.pdf").read_bytes()[:5] == b"%PDF-"


def test_rule_all_adds_the_join_and_a_covariate_change_reruns_no_score(
    sugarcrepe_run: Path,
) -> None:
    planned = rule_counts(plan(sugarcrepe_run))  # the fixture built TARGETS only, not `all`
    assert "sugarcrepe_models" in planned and "aggregate_models" in planned
    assert "sugarcrepe_score" not in planned and "sugarcrepe_tables" not in planned
    path = sugarcrepe_run / "config" / "test.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    config["models"]["clip_a"]["covariates"]["zero_shot_accuracy"] = 0.99
    try:
        path.write_text(yaml.safe_dump(config))
        planned = rule_counts(plan(sugarcrepe_run, *TARGETS))
    finally:
        path.write_text(original)
    assert "sugarcrepe_tables" in planned and "sugarcrepe_figure" in planned
    assert "sugarcrepe_score" not in planned
