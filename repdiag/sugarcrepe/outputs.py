"""What the SugarCrepe target builds, from the config alone (gathered by
:func:`repdiag.studies.final_outputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.common.figures import figure_paths
from repdiag.sugarcrepe.data import scored_models


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """`snakemake sugarcrepe`: each scored model's result, the tables, the models table joined
    with the accuracies and the figure (nothing unless sugarcrepe.enabled)."""
    if not config["sugarcrepe"]["enabled"]:
        return {"sugarcrepe": []}
    return {
        "sugarcrepe": [
            *(f"results/sugarcrepe/{key}.json" for key in scored_models(config)),
            "results/tables/sugarcrepe.csv",
            "results/tables/sugarcrepe_partial.csv",
            "results/tables/models_sugarcrepe.csv",
            *figure_paths("sugarcrepe_jer"),
        ]
    }
