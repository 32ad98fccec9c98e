"""The CIFAR-10 branch's final outputs: none while it is off, its tables and figure when on."""

from __future__ import annotations

from repdiag.cifar.outputs import final_outputs
from tests.planning import resolved_config


def test_off_builds_nothing_on_builds_the_tables_and_figure() -> None:
    config = resolved_config()
    assert final_outputs(config) == {"cifar": []}
    config["cifar"]["enabled"] = True
    assert final_outputs(config)["cifar"] == [
        "results/tables/cifar_simclr.csv",
        "results/tables/cifar_simclr_runs.csv",
        "results/figures/cifar_simclr.png",
        "results/figures/cifar_simclr.pdf",
    ]
