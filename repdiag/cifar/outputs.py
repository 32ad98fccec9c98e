"""What the CIFAR-10 SimCLR target builds, from the config alone (gathered by
:func:`repdiag.studies.final_outputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.cifar.study import run_names
from repdiag.common.figures import figure_paths


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """`snakemake cifar`: the table over runs, the per-run table and the figure (nothing when
    the config names no run)."""
    if not run_names(config["cifar"]):
        return {"cifar": []}
    return {
        "cifar": [
            "results/tables/cifar_simclr.csv",
            "results/tables/cifar_simclr_runs.csv",
            *figure_paths("cifar_simclr"),
        ]
    }
