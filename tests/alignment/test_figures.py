"""The alignment figures from a fabricated grid (repdiag.alignment.figures)."""

from __future__ import annotations

import pandas as pd

from repdiag.alignment.figures import methods_figure, paired_fraction_figure
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
