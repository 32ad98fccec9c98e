"""The identifiability tables and figures: aggregation over seeds, the paper comparison from
``claims.yaml`` and the two figures (repdiag.identifiability.report)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from repdiag.common.units import ReplicationError
from repdiag.identifiability.report import (
    aggregate,
    paper_comparison,
    plot_r2,
    plot_ratio,
    results_frame,
)
from repdiag.identifiability.study import (
    Cell,
)


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


def test_a_run_listed_twice_is_refused_naming_it() -> None:
    record = fake_record("identity", "full", "mlp", "infonce", None, 0, 0.995)
    other = fake_record("identity", "full", "mlp", "infonce", None, 1, 0.985)
    with pytest.raises(ReplicationError) as err:
        results_frame([record, other, dict(record)])
    assert "the identifiability tables" in str(err.value)
    assert f"{record['cell']}, {record['cell']}" in str(err.value)
    assert len(results_frame([record, other, {**record, "steps": 1000}])) == 3  # another run


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
