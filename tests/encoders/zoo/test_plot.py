"""Curve files and the curves figure."""

from __future__ import annotations

import numpy as np
import pytest

from repdiag.core.errors import StoreError
from repdiag.encoders.zoo.checkpoint import write_curve
from repdiag.encoders.zoo.plot import moving_average, plot_curves, read_curve


def test_curve_round_trip_is_exact(tmp_path):
    losses = [3.0, 2.718281828459045, 1e-12, 0.1 + 0.2]
    write_curve(tmp_path / "curve.csv", losses)
    assert (tmp_path / "curve.csv").read_text().splitlines()[:2] == ["step,loss", "0,3.0"]
    assert read_curve(tmp_path / "curve.csv").tolist() == losses


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("loss\n1.0\n", "expected the header"),
        ("step,loss\n0,1.0\n2,0.5\n", "rows must be steps 0, 1, 2"),
        ("step,loss\n0,nan\n", "non-finite"),
        ("step,loss\n0,abc\n", "unreadable row"),
    ],
)
def test_bad_curves_are_named(tmp_path, text, message):
    (tmp_path / "curve.csv").write_text(text)
    with pytest.raises(StoreError, match=message):
        read_curve(tmp_path / "curve.csv")
    with pytest.raises(StoreError, match="does not exist"):
        read_curve(tmp_path / "missing.csv")


def test_moving_average_closed_form():
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert moving_average(values, 2).tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert moving_average(values, 1).tolist() == values.tolist()


def test_figure_is_written_as_png_and_pdf(tmp_path):
    curves = {"simclr": np.linspace(3, 2, 20), "mae": np.linspace(1, 0.5, 20)}
    metas = {"simclr": {"family": "contrastive", "objective": "simclr", "backbone": "vit"},
             "mae": {"family": "masked_modeling", "objective": "mae", "backbone": "vit"}}  # fmt: skip
    plot_curves(curves, metas, tmp_path / "c.png", tmp_path / "c.pdf")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "c.pdf").read_bytes()[:5] == b"%PDF-"
    assert not list(tmp_path.glob(".*tmp*"))  # atomic: no temporary file left behind
