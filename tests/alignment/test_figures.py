"""The alignment figures from a fabricated grid (repdiag.alignment.figures)."""

from __future__ import annotations

import pandas as pd
import pytest

from repdiag.alignment.figures import methods_figure, paired_fraction_figure, real_figure
from repdiag.alignment.report import results_table
from tests.alignment.fakes import fake_grid

# claims ----------------------------------------------------------------------------------------


def test_figures_are_written(tmp_path):
    table = results_table(fake_grid())
    table.to_csv(tmp_path / "alignment.csv", index=False)
    table = pd.read_csv(tmp_path / "alignment.csv")  # as the rule reads it: empty ablation -> NaN
    methods_figure(table, tmp_path / "m.png", tmp_path / "m.pdf")
    paired_fraction_figure(table, tmp_path / "f.png", tmp_path / "f.pdf")
    for name in ("m.png", "m.pdf", "f.png", "f.pdf"):
        assert (tmp_path / name).stat().st_size > 5000
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_real_figure_has_one_row_per_pair_and_refuses_a_table_without_real_rows(tmp_path):
    from tests.alignment.fakes import fake_record

    real = [
        {
            "pair": pair,
            "runs": [
                fake_record(v, f, 0, tr_intervention=0.3) | {"paired_fraction": f}
                for v in ("sae_a", "cosae-all")
                for f in (0.01, 1.0)
            ]
            + [fake_record("independent", 0.0, 0)],
        }
        for pair in ("a__b__final", "a__c__final")
    ]
    table = results_table(fake_grid(), real)
    real_figure(table, tmp_path / "r.png", tmp_path / "r.pdf")
    assert (tmp_path / "r.png").stat().st_size > 5000
    assert (tmp_path / "r.pdf").read_bytes()[:4] == b"%PDF"
    with pytest.raises(ValueError, match=r"alignment\.real\.pairs"):
        real_figure(results_table(fake_grid()), tmp_path / "x.png", tmp_path / "x.pdf")
