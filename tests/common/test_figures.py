"""One palette, one way to save a figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg
import matplotlib.pyplot as plt

from repdiag.binding import APART_FAMILIES
from repdiag.common.figures import (
    DPI,
    FAMILY_COLOURS,
    OKABE_ITO,
    cycle_colour,
    family_colour,
    figure_paths,
    save_figure,
)


def test_palette_is_okabe_ito_and_distinct():
    okabe_ito = {
        "#000000",
        "#E69F00",
        "#56B4E9",
        "#009E73",
        "#F0E442",
        "#0072B2",
        "#D55E00",
        "#CC79A7",
    }
    families = {f: c for f, c in FAMILY_COLOURS.items() if f not in APART_FAMILIES}
    colours = list(families.values())
    assert set(colours) <= okabe_ito and len(set(colours)) == len(colours)
    assert FAMILY_COLOURS["control"] == "#999999"  # neutral grey, apart from the families
    assert family_colour("unknown") == "#000000"


def test_okabe_ito_cycles_for_series_that_are_not_families():
    assert len(set(OKABE_ITO)) == 8
    assert [cycle_colour(i) for i in (0, 8, 9)] == [OKABE_ITO[0], OKABE_ITO[0], OKABE_ITO[1]]


def test_save_figure_writes_exact_pixels_atomically_and_closes(tmp_path):
    fig, ax = plt.subplots(figsize=(3.0, 2.0))
    ax.plot([0, 1], [1, 0])
    png, pdf = save_figure(fig, tmp_path / "a.png", tmp_path / "a.pdf")
    assert mpimg.imread(png).shape[:2] == (round(2.0 * DPI), round(3.0 * DPI))
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert not plt.fignum_exists(fig.number)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pdf", "a.png"]


def test_the_same_figure_gives_the_same_pdf_bytes(tmp_path):
    def draw(name):
        fig, ax = plt.subplots(figsize=(2.0, 2.0))
        ax.plot([0, 1], [0, 1])
        return save_figure(fig, tmp_path / f"{name}.pdf")[0].read_bytes()

    first, second = draw("a"), draw("b")
    assert first == second and b"CreationDate" not in first


def test_figure_paths_are_the_png_and_pdf_save_figure_writes(tmp_path):
    paths = figure_paths("scatter", str(tmp_path / "figs"))
    assert paths == [f"{tmp_path}/figs/scatter.png", f"{tmp_path}/figs/scatter.pdf"]
    assert figure_paths("scatter") == ["results/figures/scatter.png", "results/figures/scatter.pdf"]
    fig, _ = plt.subplots()
    written = save_figure(fig, *paths)
    assert [str(p) for p in written] == paths
    assert mpimg.imread(paths[0]).ndim == 3 and Path(paths[1]).read_bytes().startswith(b"%PDF")
