"""The identifiability study's final outputs: the grid's tables and figures, the check's tables,
each present exactly when its section has cells."""

from __future__ import annotations

from repdiag.identifiability.outputs import final_outputs
from tests.planning import resolved_config


def test_the_grid_and_the_check_each_give_their_tables() -> None:
    outputs = final_outputs(resolved_config())
    assert outputs["identifiability"] == [
        "results/tables/identifiability.csv",
        "results/tables/identifiability_paper.csv",
        "results/figures/identifiability_r2.png",
        "results/figures/identifiability_r2.pdf",
        "results/figures/identifiability_ratio.png",
        "results/figures/identifiability_ratio.pdf",
    ]
    assert "results/identifiability_check/summary.md" in outputs["identifiability_check"]


def test_no_check_section_no_check_outputs() -> None:
    config = resolved_config()
    config["identifiability"].pop("check", None)
    assert final_outputs(config)["identifiability_check"] == []
