"""Series grids: every cell declared once as a zoo run and a model, names from the template,
existing runs stand in for their cells, bad declarations refused with the key named."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError
from repdiag.core.series import expand_series, series_cells, value_label

REPO = Path(__file__).resolve().parents[2]
RUN = {"objective": "supervised", "backbone": "resnet", "steps": 300}


def grid(**extra):
    series = {
        "name": "dose_{lambda}_s{seed}",
        "family": "binding_dose",
        "run": dict(RUN),
        "axes": {
            "lambda": {"set": "hparams.slot_weight", "values": [0.1, 1.0]},
            "seed": {"set": "seed", "values": [0, 1, 2]},
        },
    }
    series.update(extra)
    return series


@pytest.mark.parametrize(
    ("value", "label"),
    [(0.1, "0p1"), (1.0, "1"), (0.0, "0"), (-0.05, "m0p05"), (3, "3"), ("a", "a")],
)
def test_value_labels(value, label):
    assert value_label(value) == label


def test_cells_are_the_product_of_the_axes_in_order():
    cells = series_cells("dose", grid())
    assert [c["name"] for c in cells] == [f"dose_{d}_s{s}" for d in ("0p1", "1") for s in (0, 1, 2)]
    last = cells[-1]
    assert last["values"] == {"lambda": 1.0, "seed": 2}
    assert last["run"] == {**RUN, "hparams": {"slot_weight": 1.0}, "seed": 2}
    assert all(c["family"] == "binding_dose" for c in cells)


def test_expansion_declares_runs_and_models_once_and_is_idempotent():
    config = {"models": {}, "zoo": {"objectives": {"supervised_s0": {**RUN, "seed": 0}}}}
    config["series"] = {
        "dose": grid(
            axes={
                "lambda": {
                    "set": "hparams.slot_weight",
                    "values": [0.0, 0.3],
                    "families": {"0": "supervised"},
                },
                "seed": {"set": "seed", "values": [0, 1]},
            },
            existing={"dose_0_s0": "supervised_s0"},
        )
    }
    members = expand_series(config)
    assert members["dose"] == {
        "dose_0_s0": "supervised_s0",
        "dose_0_s1": "dose_0_s1",
        "dose_0p3_s0": "dose_0p3_s0",
        "dose_0p3_s1": "dose_0p3_s1",
    }
    assert "dose_0_s0" not in config["zoo"]["objectives"]
    assert set(config["models"]) == {"dose_0_s1", "dose_0p3_s0", "dose_0p3_s1"}
    assert config["models"]["dose_0_s1"]["family"] == "supervised"
    assert config["models"]["dose_0p3_s1"] == {
        "source": "zoo",
        "id": "dose_0p3_s1",
        "family": "binding_dose",
    }
    again = copy.deepcopy(config)
    expand_series(again)
    assert again == config


def test_patch_axes_merge_into_the_run():
    series = grid(
        name="arm_{arm}_s{seed}",
        run={**RUN, "hparams": {"slot_weight": 0.3}},
        axes={
            "arm": {"patches": {"plain": {}, "raise": {"jer_regulariser": {"weight": 0.05}}}},
            "seed": {"set": "seed", "values": [0]},
        },
    )
    cells = {c["name"]: c for c in series_cells("causal", series)}
    assert cells["arm_plain_s0"]["run"] == {**RUN, "hparams": {"slot_weight": 0.3}, "seed": 0}
    assert cells["arm_raise_s0"]["run"]["jer_regulariser"] == {"weight": 0.05}
    assert cells["arm_raise_s0"]["values"]["arm"] == "raise"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "dose_{lambda}"}, "same run name"),
        ({"name": "dose_{dose}_s{seed}"}, "cannot be filled"),
        ({"existing": {"dose_9_s0": "supervised_s0"}}, "not cells of the series"),
        ({"existing": {"dose_0p1_s0": "nowhere"}}, "is not a zoo run"),
        ({"run": {**RUN, "stepz": 3}}, "stepz"),
        ({"family": "dose"}, "family 'dose' is not one of"),
        ({"run": {**RUN, "steps": 3.0}}, "steps: 3.0 is not of type 'integer'"),  # as the schema's
    ],
)
def test_bad_series_are_refused_naming_the_key(change, message):
    config = {"models": {}, "zoo": {"objectives": {"supervised_s0": dict(RUN)}}}
    config["series"] = {"dose": grid(**change)}
    with pytest.raises(ConfigError, match=message) as err:
        expand_series(config)
    assert "series.dose" in str(err.value)


def test_a_hand_declared_run_with_other_settings_is_refused():
    config = {"models": {}, "zoo": {"objectives": {"dose_0p1_s0": {**RUN, "lr": 0.5}}}}
    config["series"] = {"dose": grid()}
    with pytest.raises(ConfigError, match=r"zoo\.objectives\.dose_0p1_s0 is declared by hand"):
        fill_defaults(config)


def test_the_default_config_declares_the_dose_series_by_grid():
    config = load_config(REPO / "config/config.yaml")
    runs, models = config["zoo"]["objectives"], config["models"]
    doses = {0.0: [], 0.1: [], 0.3: [], 1.0: []}
    for name, run in runs.items():
        if name.startswith("causal_"):  # binding_causal's own plain arm, apart from the series
            continue
        slot = (run.get("hparams") or {}).get("slot_weight")
        if run["objective"] != "supervised" or run["jer_regulariser"]["weight"] or run["stop_at"]:
            continue
        if run["steps"] == 300 and (run.get("hparams") or {}).get("label") is None:
            doses.setdefault(float(slot or 0.0), []).append(run["seed"])
    assert {dose: sorted(seeds) for dose, seeds in doses.items()} == {
        dose: [0, 1, 2, 3] for dose in (0.0, 0.1, 0.3, 1.0)
    }
    # checkpoints of one dose run, step 0 being random_resnet (not a second copy of it); the
    # family comparison's runs each save step 1000 (binding_families, 28 runs)
    steps = sorted(run["stop_at"] for run in runs.values() if run["stop_at"] is not None)
    assert steps == [100, 200] + [1000] * 28
    zero_step = [name for name, run in runs.items() if run["steps"] == 0 or run["stop_at"] == 0]
    assert zero_step == ["random_resnet"]
    assert all(models[name]["id"] == name for name in runs if name in models)


def test_named_series_are_looked_up_and_an_unknown_name_names_the_key():
    from repdiag.core.series import named_series

    base = {"name": "r_s{seed}", "family": "supervised", "run": {}, "axes": {"seed": {}}}
    config = {
        "series": {"a": {**base, "existing": {"r_s0": "x"}}, "b": base},
        "section": {"series": ["b", "a"]},
    }
    found = named_series(config, "section.series", "its runs")
    assert [(name, existing) for name, _, existing in found] == [("b", {}), ("a", {"r_s0": "x"})]
    assert found[0][1] is config["series"]["b"]
    assert named_series({"series": {}}, "section.series", "its runs") == []
    config["section"]["series"] = ["c"]
    with pytest.raises(
        ConfigError,
        match=r"section\.series: 'c' is not a series \(has \['a', 'b'\]\); declare its runs under series",
    ):
        named_series(config, "section.series", "its runs")


def _saving_config(**run: object) -> dict:
    from tests.encoders.zoo.conftest import tiny_config

    config = tiny_config()
    config["zoo"]["objectives"]["simclr"].update(run)
    return fill_defaults(config)


def test_save_at_declares_one_run_per_step_idempotently():
    from repdiag.core.series import expand_saved

    config = _saving_config(save_at=[2, 1])
    runs = config["zoo"]["objectives"]  # fill_defaults (in tiny_config) expanded them
    assert {name for name in runs if name.startswith("simclr-")} == {"simclr-step1", "simclr-step2"}
    child = runs["simclr-step2"]
    assert child["stop_at"] == 2 and child["saved_by"] == "simclr" and child["save_at"] == []
    assert child["objective"] == "simclr"  # the parent's objective, not the child's name
    before = copy.deepcopy(runs)
    expand_saved(config)
    fill_defaults(config)
    assert config["zoo"]["objectives"] == before


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"save_at": [4]}, r"simclr\.save_at: steps \[4\] are not before the run's last step"),
        ({"save_at": [1], "stop_at": 2}, r"stops early \(stop_at\) saves nothing"),
        ({"save_at": [1], "jer_regulariser": {"weight": 0.1}}, r"pushed run .* cannot save"),
        ({"saved_by": "clip"}, r"simclr\.saved_by: set by the workflow"),
    ],
)
def test_bad_save_at_is_refused_naming_the_key(run, message):
    with pytest.raises(ConfigError, match=message):
        _saving_config(**run)


def test_a_saved_step_whose_name_is_taken_is_refused():
    from tests.encoders.zoo.conftest import tiny_config

    config = tiny_config()
    config["zoo"]["objectives"]["simclr"]["save_at"] = [1]
    config["zoo"]["objectives"]["simclr-step1"] = {"objective": "clip", "steps": 1}
    with pytest.raises(ConfigError, match=r"step 1 is the run 'simclr-step1'"):
        fill_defaults(config)


def test_a_series_runs_saved_steps_get_models_and_hand_declared_ones_keep_theirs():
    """A run a series declares (model key and id its name) gets a model per saved step, in its
    family; a step some model already reads (config/test.yaml's hand-declared `dose` checkpoint)
    gets no second one."""
    from tests.encoders.zoo.conftest import tiny_config

    config = tiny_config()
    config["series"] = {
        "fam": {
            "name": "{objective}_fam_s{seed}",
            "family": "contrastive",
            "run": {"backbone": "vit", "steps": 3, "batch_size": 8, "save_at": [1]},
            "axes": {
                "objective": {"set": "objective", "values": ["simclr"]},
                "seed": {"set": "seed", "values": [0, 1]},
            },
        }
    }
    config = fill_defaults(config)
    models = config["models"]
    for seed in (0, 1):
        child = f"simclr_fam_s{seed}-step1"
        declared = {key: models[child][key] for key in ("source", "id", "family")}
        assert declared == {"source": "zoo", "id": child, "family": "contrastive"}
        assert config["zoo"]["objectives"][child]["saved_by"] == f"simclr_fam_s{seed}"
    before = copy.deepcopy(models)
    fill_defaults(config)  # idempotent
    assert config["models"] == before
    test_config = load_config(REPO / "config" / "test.yaml")
    readers = [k for k, m in test_config["models"].items() if m.get("id") == "dose-step2"]
    assert readers == ["dose"]  # the hand-declared model alone
