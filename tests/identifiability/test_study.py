"""The identifiability grid, per-cell params, semantic checks and one tiny cell."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError
from repdiag.identifiability.study import (
    Cell,
    cell_names,
    cell_params,
    check_identifiability_config,
    grid_cells,
    parse_cell,
    run_cell,
)

torch.set_num_threads(1)


def defaults() -> dict:
    """The identifiability section with every schema default."""
    return fill_defaults({"identifiability": {}})["identifiability"]


def tiny_params(name: str) -> dict:
    section = defaults()
    section["train"] |= {"steps": 4, "batch_size": 16, "log_every": 2}
    section["loss"] |= {"n_negatives": 8, "group_size": 4}
    section["evaluation"] |= {"n_samples": 64}
    section["encoders"]["mlp"]["hidden"] = [8]
    section["encoders"]["inverse"]["steps"] = None  # train.steps for every encoder
    section["generators"]["invertible_mlp"]["n_cond_samples"] = 200
    return cell_params(section, name)


def test_default_grid_has_every_cell_once() -> None:
    cells = grid_cells(defaults())
    infonce = [c for c in cells if c.loss == "infonce"]
    sweep = [c for c in cells if c.loss == "support_corrected"]
    assert len(infonce) == 5 * 2 * 2 * 3 and len(sweep) == 5 * 3 and len(cells) == 75
    assert {c.ratio for c in sweep} == {0.0, 0.25, 0.5, 0.75, 1.0}
    assert all(c.sampling == "restricted" and c.encoder == "mlp" for c in sweep)
    assert len({c.name for c in cells}) == len(cells)


def test_cell_names_round_trip() -> None:
    for cell in (
        Cell("invertible_mlp", "full", "inverse", "infonce", None, 2),
        Cell("identity", "restricted", "mlp", "support_corrected", 0.25, 10),
    ):
        assert parse_cell(cell.name) == cell
    assert Cell("identity", "restricted", "mlp", "support_corrected", 0.25, 1).name == (
        "identity-restricted-mlp-support_corrected-r0.25-s1"
    )
    with pytest.raises(ConfigError, match="cell name"):
        parse_cell("identity-sideways-mlp-infonce-s0")


def test_support_corrected_in_the_grid_runs_restricted_at_ratio_one_and_dedupes() -> None:
    section = defaults()
    section["grid"] |= {
        "generators": ["identity"],
        "losses": ["infonce", "support_corrected"],
        "seeds": [0],
    }
    section["ratio_sweep"] |= {"ratios": [0.5, 1.0], "seeds": [0]}
    names = cell_names(section)
    assert "identity-restricted-mlp-support_corrected-r1.00-s0" in names
    assert "identity-restricted-inverse-support_corrected-r1.00-s0" in names
    assert not any(n.startswith("identity-full") and "support_corrected" in n for n in names)
    assert (
        len(names) == 4 + 2 + 1
    )  # 4 InfoNCE, 2 corrected at ratio 1 (one shared with the sweep), ratio 0.5


def test_cell_params_hold_exactly_what_the_cell_uses() -> None:
    section = defaults()
    mlp_full = cell_params(section, "spiral-full-mlp-infonce-s1")
    assert mlp_full["seed"] == 1 and mlp_full["generator"] == {
        "name": "spiral",
        "params": {"angle_scale": math.pi},
    }
    assert mlp_full["encoder"] == {
        "kind": "mlp",
        "normalize": True,
        "variant": "paper",
        "hidden": [128, 256, 256, 256, 128],
        "lr": 0.0001,
        "lr_schedule": "constant",
    }
    assert "n_fixed" not in mlp_full["sampling"] and "ratio" not in mlp_full["loss"]
    inverse = cell_params(section, "patches-restricted-inverse-infonce-s0")
    assert inverse["encoder"]["lr"] == 0.01 and "hidden" not in inverse["encoder"]
    assert inverse["encoder"]["patches_sharpness"] == 300.0 and inverse["sampling"]["n_fixed"] == 1
    # inverse models train for encoders.inverse.steps (null: train.steps), the MLP for train.steps
    steps = section["train"]["steps"]
    assert inverse["train"]["steps"] == 1200 != steps and mlp_full["train"]["steps"] == steps
    section["encoders"]["inverse"]["steps"] = None
    assert cell_params(section, "patches-restricted-inverse-infonce-s0")["train"]["steps"] == steps
    corrected = cell_params(section, "identity-restricted-mlp-support_corrected-r0.75-s2")
    assert corrected["loss"]["ratio"] == 0.75 and corrected["loss"]["group_size"] == 32
    changed = copy.deepcopy(section)
    changed["generators"]["patches"]["n_slices"] = 6
    changed["encoders"]["mlp"]["hidden"] = [32]
    assert cell_params(changed, "spiral-full-inverse-infonce-s0") == cell_params(
        section, "spiral-full-inverse-infonce-s0"
    )


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda s: s["sampling"].update(n_fixed=2), "identifiability.sampling.n_fixed"),
        (
            lambda s: s["generators"]["linear"].update(out_dim=2),
            "identifiability.generators.linear.out_dim",
        ),
        (lambda s: s["train"].update(batch_size=100), "identifiability.train.batch_size"),
        (lambda s: s["ratio_sweep"].update(ratios=[0.125]), "identifiability.ratio_sweep.ratios"),
        (lambda s: s["grid"].update(seeds=[0, 0]), "identifiability.grid.seeds"),
        (
            lambda s: (s["grid"].update(generators=[]), s["ratio_sweep"].update(generators=[])),
            "define no cell",
        ),
    ],
)
def test_semantic_checks_name_the_key(edit, key: str) -> None:
    config = {"identifiability": defaults()}
    check_identifiability_config(config)
    edit(config["identifiability"])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_identifiability_config(config)


@pytest.mark.parametrize(
    "name",
    [
        "invertible_mlp-restricted-inverse-infonce-s0",
        "linear-restricted-mlp-support_corrected-r0.50-s1",
    ],
)
def test_run_cell_returns_the_record_and_curve(name: str) -> None:
    record, curve = run_cell(tiny_params(name))
    assert record["cell"] == name and record["steps"] == 4 and record["device"] == "cpu"
    assert set(record["metrics"]) == {"r2", "mcc", "ape", "r2_z1", "r2_z2", "r2_z3"}
    assert all(math.isfinite(v) for v in record["metrics"].values())
    assert [step for step, _ in curve] == [2, 4] and record["final_loss"] == curve[-1][1]
    assert record["params"]["cell"] == name
