"""Summary table (means, spreads, seed-paired gaps, the interaction) and the figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from repdiag.cifar.report import plot_cifar, runs_table, summary_table
from repdiag.common.tables import write_csv

ARCHS = ["resnet18", "vit", "mlp"]
REGIMES = ["all", "crop_only", "no_crop"]
BASE = {"resnet18": 0.80, "vit": 0.70, "mlp": 0.55}
REGIME_EFFECT = {"all": 0.0, "crop_only": -0.05, "no_crop": -0.20}
WIDENING = {"all": 0.0, "crop_only": 0.02, "no_crop": 0.10}  # extra loss of the weaker models
SEED_NOISE = {0: -0.01, 1: 0.0, 2: 0.025}


def _accuracy(arch: str, regime: str, seed: int) -> float:
    weakness = ARCHS.index(arch) / 2  # 0, 0.5, 1
    return BASE[arch] + REGIME_EFFECT[regime] - weakness * WIDENING[regime] + SEED_NOISE[seed]


def _runs(seeds=(0, 1, 2), drop: tuple[str, str, int] | None = None) -> pd.DataFrame:
    rows = [
        {"architecture": a, "regime": r, "seed": s, "accuracy": _accuracy(a, r, s), "chance": 0.1}
        for a in ARCHS
        for r in REGIMES
        for s in seeds
        if (a, r, s) != drop
    ]
    return pd.DataFrame(rows)


def test_accuracy_rows_have_mean_spread_rank_and_regime_effect() -> None:
    table = summary_table(_runs(), ARCHS, REGIMES)
    acc = table[table["kind"] == "accuracy"].set_index(["regime", "architecture"])
    assert len(acc) == 9
    noise = np.array(list(SEED_NOISE.values()))
    for a in ARCHS:
        for r in REGIMES:
            row = acc.loc[(r, a)]
            values = [_accuracy(a, r, s) for s in SEED_NOISE]
            assert row["mean"] == pytest.approx(np.mean(values))
            assert row["std"] == pytest.approx(np.std(noise, ddof=1))
            assert (row["min"], row["max"]) == pytest.approx((min(values), max(values)))
            assert row["rank"] == ARCHS.index(a) + 1 and row["n_seeds"] == 3
            expected = REGIME_EFFECT[r] - ARCHS.index(a) / 2 * WIDENING[r]
            assert row["delta_vs_reference"] == pytest.approx(expected)
            assert row["chance"] == 0.1 and row["reference_regime"] == "all"
    assert acc.loc[("no_crop", "mlp"), "regime_label"] == "All w/o crop"


def test_gap_rows_are_seed_paired_and_state_the_interaction() -> None:
    table = summary_table(_runs(), ARCHS, REGIMES)
    gaps = table[table["kind"] == "gap"].set_index(["regime", "architecture"])
    assert sorted(set(gaps.index.get_level_values(1))) == [
        "resnet18 - mlp",
        "resnet18 - vit",
        "vit - mlp",
    ]
    for r in REGIMES:
        row = gaps.loc[(r, "resnet18 - mlp")]
        assert row["mean"] == pytest.approx(BASE["resnet18"] - BASE["mlp"] + WIDENING[r])
        assert row["std"] == pytest.approx(0.0, abs=1e-12)  # the seed effect cancels in pairs
        assert row["delta_vs_reference"] == pytest.approx(WIDENING[r])  # the interaction
        half = gaps.loc[(r, "vit - mlp")]
        assert half["delta_vs_reference"] == pytest.approx(WIDENING[r] / 2)
    spread = table[table["kind"] == "spread"].set_index("regime")
    assert list(spread["architecture"]) == ["resnet18 - mlp"] * 3
    assert spread.loc["no_crop", "mean"] == pytest.approx(0.25 + 0.10)
    assert spread.loc["no_crop", "delta_vs_reference"] == pytest.approx(0.10)


def test_one_seed_and_missing_seeds_are_stated() -> None:
    one = summary_table(_runs(seeds=(1,)), ARCHS, REGIMES)
    acc = one[one["kind"] == "accuracy"]
    assert acc["std"].isna().all() and (acc["note"] == "one seed: no spread").all()
    partial = summary_table(_runs(drop=("mlp", "all", 2)), ARCHS, REGIMES)
    row = partial[(partial["kind"] == "gap") & (partial["regime"] == "all")]
    row = row.set_index("architecture").loc["resnet18 - mlp"]
    assert row["n_seeds"] == 2  # only the seeds both ran
    assert row["mean"] == pytest.approx(BASE["resnet18"] - BASE["mlp"])


def test_runs_table_and_csv_round_trip(tmp_path: Path) -> None:
    record = {
        "run": "vit__all__s0",
        "architecture": "vit",
        "regime": "all",
        "regime_label": "All",
        "seed": 0,
        "probe": {
            "accuracy": 0.5,
            "train_accuracy": 0.6,
            "chance": 0.1,
            "wall_time_s": 1.0,
            "feature_wall_time_s": 0.5,
        },
        "train": {
            "initial_loss": 4.0,
            "final_loss": 3.0,
            "steps": 5,
            "epochs": 1.0,
            "wall_time_s": 2.0,
            "images_per_s": 80.0,
            "device": "cpu",
        },
        "data": {"n_train": 40, "n_test": 20},
        "model": {"encoder_parameters": 1234},
    }
    runs = runs_table([record])
    assert runs.loc[0, "accuracy"] == 0.5
    assert not [c for c in runs.columns if c.endswith(("_s", "per_s"))]  # times stay in the JSON
    table = summary_table(_runs(seeds=(0,)), ARCHS, REGIMES)
    write_csv(table, tmp_path / "t.csv", float_format="%.6g")
    text = (tmp_path / "t.csv").read_text().splitlines()
    assert text[0].startswith("kind,regime,regime_label,architecture,n_seeds,mean,std")
    back = pd.read_csv(tmp_path / "t.csv")
    np.testing.assert_allclose(back["mean"], table["mean"], rtol=1e-5)
    assert ",," in text[1]  # NaN std is an empty cell


def test_figure_is_written_as_png_and_pdf(tmp_path: Path) -> None:
    runs = _runs()
    table = summary_table(runs, ARCHS, REGIMES)
    png, pdf = tmp_path / "f.png", tmp_path / "f.pdf"
    plot_cifar(runs, table, ARCHS, REGIMES, [png, pdf])
    assert pdf.read_bytes().startswith(b"%PDF")
    with Image.open(png) as image:
        assert image.size == (1650, 720)  # 11 x 4.8 inches at 150 dpi
