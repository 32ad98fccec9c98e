"""What the alignment study's workflow target builds, from the config alone (gathered by
:func:`repdiag.studies.final_outputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.alignment.grid import grid_cells, real_pairs, tuning_enabled
from repdiag.common.figures import figure_paths


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """`snakemake alignment`: the tables, claims and figures of the synthetic grid and the real
    pairs, the real pairs' figure when pairs are named, and the learning-rate table when
    alignment.tuning is on."""
    section = config["alignment"]
    real = real_pairs(section)
    paths: list[str] = []
    if grid_cells(section) or real:
        paths += [
            *(f"results/tables/alignment{s}.csv" for s in ("", "_summary", "_claims")),
            *figure_paths("alignment_methods"),
            *figure_paths("alignment_paired_fraction"),
        ]
    if real:
        paths += figure_paths("alignment_real")
    if tuning_enabled(section):
        paths.append("results/tables/alignment_lr.csv")
    return {"alignment": paths}
