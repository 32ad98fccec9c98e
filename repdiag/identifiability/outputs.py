"""What the identifiability study's workflow targets build, from the config alone: the grid's
tables and figures (``identifiability``) and the like-for-like check against the authors' runs
(``identifiability_check``). Gathered by :func:`repdiag.studies.final_outputs`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.common.figures import figure_paths
from repdiag.identifiability.study import cell_names, check_section


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """The final outputs of ``identifiability`` and ``identifiability_check``."""
    section = config["identifiability"]
    grid = [
        "results/tables/identifiability.csv",
        "results/tables/identifiability_paper.csv",
        *figure_paths("identifiability_r2"),
        *figure_paths("identifiability_ratio"),
    ]
    check = [
        "results/tables/identifiability_check.csv",
        "results/tables/identifiability_check_claims.csv",
        "results/identifiability_check/summary.md",
    ]
    return {
        "identifiability": grid if cell_names(section) else [],
        "identifiability_check": check if cell_names(check_section(section)) else [],
    }
