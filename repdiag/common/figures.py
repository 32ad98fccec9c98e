"""One palette and one way to save a figure, for every study's plots.

Colours are the Okabe-Ito palette (Okabe and Ito 2008), which stays distinguishable under the
common colour-vision deficiencies; each objective family has one fixed colour in every figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 150
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
FAMILY_COLOURS = {
    "variance_decorrelation": "#0072B2",  # blue
    "masked_modeling": "#E69F00",  # orange
    "clustering_distillation": "#009E73",  # bluish green
    "contrastive": "#CC79A7",  # reddish purple
    "vision_language": "#D55E00",  # vermillion
    "supervised": "#56B4E9",  # sky blue
    "other": "#000000",  # black
    "control": "#999999",  # grey: controls, apart from the families
    "binding_supervised": "#F0E442",  # yellow: told the answer, apart from the families
    "binding_dose": "#8C6D31",  # brown: told the slots at a dose, the dose series
    "jer_intervention": "#7F7F7F",  # dark grey: JER regularised, compared with its own run
}


_FIXED_METADATA = {"pdf": {"CreationDate": None}}


def family_colour(family: str) -> str:
    """The fixed colour of an objective family (black for unknown families)."""
    return FAMILY_COLOURS.get(family, FAMILY_COLOURS["other"])


def cycle_colour(index: int) -> str:
    """The ``index``-th Okabe-Ito colour, cycling: for series that are not objective families."""
    return OKABE_ITO[index % len(OKABE_ITO)]


def figure_paths(stem: str, folder: str = "results/figures") -> list[str]:
    """The PNG (for the report) and the PDF of one workflow figure, as :func:`save_figure` writes
    them: ``<folder>/<stem>.png`` and ``.pdf``."""
    return [f"{folder}/{stem}.png", f"{folder}/{stem}.pdf"]


def save_figure(fig: Any, *paths: str | Path, dpi: int = DPI) -> list[Path]:
    """Write ``fig`` to each path (format from the suffix) atomically, then close it.

    No ``bbox_inches="tight"``: a PNG is exactly ``figsize * dpi`` pixels. A PDF carries no
    creation date, so the same figure gives the same bytes on every run.
    """
    import matplotlib.pyplot as plt

    from repdiag.core.store import atomic_path  # zarr and xarray: not at the Snakefile's parse

    written = []
    try:
        for path in map(Path, paths):
            fmt = path.suffix.lstrip(".").lower()
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format=fmt, dpi=dpi, metadata=_FIXED_METADATA.get(fmt))
            written.append(path)
    finally:
        plt.close(fig)
    return written


def interval_yerr(value: Any, low: Any, high: Any) -> Any:
    """``errorbar``'s ``yerr`` for an interval [low, high] around ``value``: the (2, n) distances
    below and above, clipped at 0 (an interval that does not contain its value draws no bar)."""
    import numpy as np

    value = np.asarray(value, dtype=float)
    return np.vstack([value - np.asarray(low, float), np.asarray(high, float) - value]).clip(min=0)
