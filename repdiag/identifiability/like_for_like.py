"""The like-for-like check: our violated-diversity MLP cells against the authors' stored runs.

The authors of seed 002 stored five runs per generator of the MLP with diversity violated
(batch 2000, 5000 steps; ``authors_runs.csv`` beside this module, with its source). Under both
codes the fixed coordinate z1 is kept in some seeds and lost in others, so a claim is read as a
distribution, not as one seed in a band:

- per generator, the fraction of our seeds in which z1 is lost (R^2(z1) < :data:`Z1_LOST`), and
  the overall R^2 median and range of ours and of the authors';
- the claim holds when the two samples of overall R^2 agree under a two-sided exact
  Mann-Whitney U test at level ``alpha`` (scipy ``mannwhitneyu(method="exact")``): agreement is
  the absence of a detectable shift, which five runs a side can only detect when it is large.

The authors' file holds the overall score only, so z1's fate is counted for our seeds alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from repdiag.common.tables import format_number, markdown_table

AUTHORS_RUNS = Path(__file__).with_name("authors_runs.csv")
Z1_LOST = 0.5
"""R^2(z1) below which the fixed coordinate counts as lost."""
ALPHA = 0.05


def authors_runs(path: str | Path = AUTHORS_RUNS) -> pd.DataFrame:
    """The authors' stored runs: generator, run, r2 (their ``linear_score``), final_loss."""
    return pd.read_csv(path, comment="#")


def z1_lost(r2_z1: Sequence[float], threshold: float = Z1_LOST) -> np.ndarray:
    """Whether each seed lost the fixed coordinate (R^2(z1) < ``threshold``)."""
    return np.asarray(r2_z1, dtype=float) < threshold


def distribution_claim(
    ours: Sequence[float], authors: Sequence[float], alpha: float = ALPHA
) -> dict[str, Any]:
    """Median and range of both samples and the exact two-sided Mann-Whitney U test.

    ``agree`` is True when p >= ``alpha``; NaN p (a side with no value) leaves it None."""
    ours, authors = np.asarray(ours, dtype=float), np.asarray(authors, dtype=float)
    row: dict[str, Any] = {"n_ours": len(ours), "n_authors": len(authors)}
    for name, values in (("ours", ours), ("authors", authors)):
        row[f"{name}_median"] = float(np.median(values)) if len(values) else math.nan
        row[f"{name}_min"] = float(values.min()) if len(values) else math.nan
        row[f"{name}_max"] = float(values.max()) if len(values) else math.nan
    if len(ours) and len(authors):
        test = sps.mannwhitneyu(ours, authors, alternative="two-sided", method="exact")
        row["u_statistic"], row["p_value"] = float(test.statistic), float(test.pvalue)
        row["agree"] = bool(test.pvalue >= alpha)
    else:
        row["u_statistic"] = row["p_value"] = math.nan
        row["agree"] = None
    row["alpha"] = alpha
    return row


def check_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The check's condition (MLP, restricted sampling, plain InfoNCE) from a results frame."""
    selected = (
        (frame["encoder"] == "mlp")
        & (frame["sampling"] == "restricted")
        & (frame["loss"] == "infonce")
    )
    return frame[selected].sort_values(["generator", "seed"]).reset_index(drop=True)


def seed_table(frame: pd.DataFrame, authors: pd.DataFrame) -> pd.DataFrame:
    """``identifiability_check.csv``: each of our seeds beside the authors' run of the same rank
    (their run ids, not the same random streams): R^2, R^2(z1), whether z1 was lost."""
    rows = []
    for generator, cells in check_cells(frame).groupby("generator", sort=True):
        theirs = authors[authors["generator"] == generator].sort_values("run")
        for i, (_, cell) in enumerate(cells.iterrows()):
            their = theirs.iloc[i] if i < len(theirs) else None
            rows.append(
                {
                    "generator": generator,
                    "seed": int(cell["seed"]),
                    "steps": int(cell["steps"]),
                    "batch_size": int(cell["batch_size"]),
                    "r2": float(cell["r2"]),
                    "r2_z1": float(cell.get("r2_z1", math.nan)),
                    "z1_lost": bool(z1_lost([cell.get("r2_z1", math.nan)])[0]),
                    "final_loss": float(cell["final_loss"]),
                    "authors_run": int(their["run"]) if their is not None else -1,
                    "authors_r2": float(their["r2"]) if their is not None else math.nan,
                    "authors_final_loss": (
                        float(their["final_loss"]) if their is not None else math.nan
                    ),
                }
            )
    return pd.DataFrame(rows)


def distribution_claims(
    frame: pd.DataFrame, authors: pd.DataFrame, alpha: float = ALPHA
) -> pd.DataFrame:
    """``identifiability_check_claims.csv``: per generator, z1's fate over our seeds and the two
    R^2 distributions with the test of :func:`distribution_claim`."""
    rows = []
    for generator, cells in check_cells(frame).groupby("generator", sort=True):
        theirs = authors.loc[authors["generator"] == generator, "r2"].to_numpy(float)
        lost = z1_lost(cells["r2_z1"]) if "r2_z1" in cells else np.array([])
        rows.append(
            {
                "generator": generator,
                "steps": int(cells["steps"].iloc[0]),
                "batch_size": int(cells["batch_size"].iloc[0]),
                "z1_lost_seeds": int(lost.sum()),
                "z1_lost_fraction": float(lost.mean()) if len(lost) else math.nan,
                **distribution_claim(cells["r2"].to_numpy(float), theirs, alpha),
            }
        )
    return pd.DataFrame(rows)


def check_markdown(seeds: pd.DataFrame, claims: pd.DataFrame) -> str:
    """Both tables as markdown (results/identifiability_check/summary.md, docs)."""
    if claims.empty:
        return "No like-for-like cells in this run (identifiability.check.generators).\n"
    first = claims.iloc[0]
    lines = [
        "# Like-for-like check: MLP, diversity violated, against the authors' stored runs",
        "",
        f"Ours: {int(first['steps'])} steps at batch {int(first['batch_size'])} (negatives = "
        "batch); the authors': 5000 steps at batch 2000. z1 lost: R^2(z1) < "
        f"{Z1_LOST}. Agreement: exact two-sided Mann-Whitney U on overall R^2, p >= "
        f"{first['alpha']}.",
        "",
    ]
    per_seed = seeds.assign(
        r2=seeds["r2"].map(lambda v: format_number(v)),
        r2_z1=seeds["r2_z1"].map(lambda v: format_number(v)),
        authors_r2=seeds["authors_r2"].map(lambda v: format_number(v)),
    )[["generator", "seed", "r2", "r2_z1", "z1_lost", "authors_run", "authors_r2"]]
    lines += [markdown_table(per_seed), ""]
    table = pd.DataFrame(
        {
            "generator": claims["generator"],
            "z1 lost (ours)": [
                f"{int(r.z1_lost_seeds)}/{int(r.n_ours)}" for r in claims.itertuples()
            ],
            "R² ours, median [range]": [
                f"{format_number(r.ours_median)} [{format_number(r.ours_min)}, "
                f"{format_number(r.ours_max)}]"
                for r in claims.itertuples()
            ],
            "R² authors, median [range]": [
                f"{format_number(r.authors_median)} [{format_number(r.authors_min)}, "
                f"{format_number(r.authors_max)}]"
                for r in claims.itertuples()
            ],
            "Mann-Whitney p": claims["p_value"].map(lambda v: format_number(v)),
            "distributions": claims["agree"].map(
                lambda v: "agree" if v is True else ("differ" if v is False else "n/a")
            ),
        }
    )
    return "\n".join([*lines, markdown_table(table), ""])
