"""The alignment study's final outputs: the real pairs' figure only with pairs, the
learning-rate table only with tuning on."""

from __future__ import annotations

from repdiag.alignment.outputs import final_outputs
from tests.planning import resolved_config


def test_tables_figures_real_pairs_and_tuning() -> None:
    paths = final_outputs(resolved_config())["alignment"]
    assert "results/figures/alignment_real.png" in paths  # test.yaml names three pairs
    assert "results/tables/alignment_lr.csv" in paths  # and tunes the learning rates
    assert len(paths) == 3 + 4 + 2 + 1


def test_without_pairs_or_tuning_only_the_grid_outputs() -> None:
    config = resolved_config()
    config["alignment"]["real"]["pairs"] = []
    config["alignment"]["tuning"]["enabled"] = False
    paths = final_outputs(config)["alignment"]
    assert not [p for p in paths if "alignment_real" in p or "alignment_lr" in p]
    assert len(paths) == 7
