"""The identifiability grid, per-cell params, semantic checks, one tiny cell, tables and figures."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError
from repdiag.identifiability.report import (
    aggregate,
    paper_comparison,
    plot_r2,
    plot_ratio,
    results_frame,
)
from repdiag.identifiability.study import (
    Cell,
    cell_names,
    cell_params,
    check_identifiability,
    grid_cells,
    parse_cell,
    run_cell,
)

torch.set_num_threads(1)


def defaults() -> dict:
    """The identifiability section with every schema default."""
    return fill_defaults({"identifiability": {}})["identifiability"]


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
    check_identifiability(config)
    edit(config["identifiability"])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_identifiability(config)


def tiny_params(name: str) -> dict:
    section = defaults()
    section["train"] |= {"steps": 4, "batch_size": 16, "log_every": 2}
    section["loss"] |= {"n_negatives": 8, "group_size": 4}
    section["evaluation"] |= {"n_samples": 64}
    section["encoders"]["mlp"]["hidden"] = [8]
    section["generators"]["invertible_mlp"]["n_cond_samples"] = 200
    return cell_params(section, name)


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


def fake_record(
    generator: str,
    sampling: str,
    encoder: str,
    loss: str,
    ratio: float | None,
    seed: int,
    r2: float,
) -> dict:
    cell = Cell(generator, sampling, encoder, loss, ratio, seed)
    return {
        "cell": cell.name,
        "generator": generator,
        "sampling": sampling,
        "encoder": encoder,
        "loss": loss,
        "ratio": ratio,
        "seed": seed,
        "metrics": {"r2": r2, "mcc": r2 / 2, "ape": 1 - r2},
        "final_loss": 5.0,
        "steps": 10,
        "batch_size": 8,
        "steps_per_s": 100.0,
        "wall_time_s": 0.1,
    }


@pytest.fixture
def frame() -> pd.DataFrame:
    records = [
        fake_record("identity", "full", "mlp", "infonce", None, 0, 0.995),
        fake_record("identity", "full", "mlp", "infonce", None, 1, 0.985),
        fake_record("spiral", "full", "mlp", "infonce", None, 0, 1.0),
        fake_record("identity", "restricted", "mlp", "infonce", None, 0, 0.1),
        fake_record("identity", "restricted", "inverse", "infonce", None, 0, 0.7),
        fake_record("identity", "restricted", "mlp", "support_corrected", 1.0, 0, 0.62),
        fake_record("identity", "restricted", "mlp", "support_corrected", 0.5, 0, 0.8),
    ]
    return results_frame(records)


def test_aggregate_means_and_spreads_over_seeds(frame: pd.DataFrame) -> None:
    table = aggregate(frame)
    assert len(table) == 6
    row = table[(table.generator == "identity") & (table.sampling == "full")].iloc[0]
    assert row.n_seeds == 2 and row.r2_mean == pytest.approx(0.99)
    assert row.r2_std == pytest.approx(math.sqrt(2 * 0.005**2))  # ddof = 1
    assert (row.r2_min, row.r2_max) == (0.985, 0.995) and row.ape_mean == pytest.approx(0.01)
    single = table[(table.loss == "support_corrected") & (table.ratio == 0.5)].iloc[0]
    assert single.n_seeds == 1 and math.isnan(single.r2_std)


def test_paper_comparison_per_generator_and_overall(frame: pd.DataFrame) -> None:
    table = paper_comparison(frame)
    paper = table[table.reference.str.startswith("paper")].set_index(
        ["claim", "generator", "ratio"]
    )
    nan = float("nan")
    row = paper.loc[("mlp_diversity", "identity", nan)]
    assert row.measured_r2 == pytest.approx(0.99) and row.r2_per_seed == "0.995 0.985"
    assert row.seeds == "0 1" and (row.measured_r2_min, row.measured_r2_max) == (0.985, 0.995)
    assert not row.holds and row.seeds_in_range == 1  # 0.985 < 0.99: not every seed agrees
    assert paper.loc[("mlp_diversity", "all", nan), "measured_r2"] == pytest.approx(
        (0.995 + 0.985 + 1.0) / 3
    )
    assert paper.loc[("mlp_diversity", "all", nan), "n_cells"] == 3
    assert paper.loc[("mlp_violated", "identity", nan), "holds"]
    assert not paper.loc[("inverse_violated", "identity", nan), "holds"]
    corrected = paper.loc[("mlp_support_corrected", "identity", 1.0)]
    assert corrected.measured_r2 == pytest.approx(0.62) and corrected.holds
    assert corrected.reference == "paper range"
    other = paper.loc[("mlp_support_corrected", "identity", 0.5)]  # every ratio is listed
    assert other.reference == "paper range (other ratio)" and not other.holds
    expected = table[table.reference == "expected"].set_index("generator")
    assert expected.loc["identity", "expected_r2"] == pytest.approx(0.064)
    assert expected.loc["identity", "expected_low"] == 0.0
    assert expected.loc["identity", "expected_high"] == pytest.approx(0.164)
    assert expected.loc["identity", "holds"]  # 0.1 lies within 0.064 +- 0.1


def test_expected_values_per_generator_and_per_coordinate_r2() -> None:
    """Spiral's band is its authors' spread 0.72 +- 0.36; every seed must lie in it to hold."""
    records = []
    for seed, r2 in enumerate([0.99, 0.98, 0.2]):
        record = fake_record("spiral", "restricted", "mlp", "infonce", None, seed, r2)
        record["metrics"] |= {"r2_z1": 0.99, "r2_z2": r2 * 0.9, "r2_z3": r2 * 0.5}
        record["params"] = {"sampling": {"n_fixed": 1}}
        records.append(record)
    table = paper_comparison(results_frame(records))
    row = table[(table.reference == "expected") & (table.generator == "spiral")].iloc[0]
    assert (row.expected_low, row.expected_high) == pytest.approx((0.36, 1.0))
    assert row.seeds_in_range == 2 and not row.holds
    assert row.r2_per_seed == "0.990 0.980 0.200"
    assert row.r2_z1_mean == pytest.approx(0.99)
    assert row.r2_z2_mean == pytest.approx(0.9 * (0.99 + 0.98 + 0.2) / 3)
    assert row.perturbed_r2_max == pytest.approx(0.99 * 0.9)  # z2 and z3 only, not z1
    aggregated = aggregate(results_frame(records))
    assert aggregated.r2_z3_max.iloc[0] == pytest.approx(0.99 * 0.5)


def test_figures_are_written_as_png_and_pdf(frame: pd.DataFrame, tmp_path: Path) -> None:
    table = aggregate(frame)
    plot_r2(table, [tmp_path / "r2.png", tmp_path / "r2.pdf"])
    plot_ratio(table, [tmp_path / "ratio.png", tmp_path / "ratio.pdf"])
    plot_ratio(
        table[table.loss == "infonce"], [tmp_path / "empty.png"]
    )  # no sweep: a note, no error
    for name, magic in (
        ("r2.png", b"\x89PNG"),
        ("r2.pdf", b"%PDF"),
        ("ratio.png", b"\x89PNG"),
        ("ratio.pdf", b"%PDF"),
        ("empty.png", b"\x89PNG"),
    ):
        assert (tmp_path / name).read_bytes().startswith(magic)
