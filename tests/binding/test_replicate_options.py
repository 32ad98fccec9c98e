"""binding_replicate: the dose series' grid again, every run with a null push."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from repdiag.binding.replicate_options import (
    check_replicate_config,
    replicate_cells,
    replicate_models,
)
from repdiag.core.config import load_config
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_default_replicate_repeats_the_dose_grid_with_a_null_push() -> None:
    config = load_config(REPO / "config/config.yaml")
    check_replicate_config(config)
    cells = replicate_cells(config)
    assert sorted((c["dose"], c["seed"]) for c in cells) == sorted(
        (d, s) for d in (0.0, 0.1, 0.3, 1.0) for s in range(4)
    )
    assert len(replicate_models(config)) == 16
    spec = config["zoo"]["objectives"]["dose_replicate_0p3_s2"]
    dose = config["zoo"]["objectives"]["dose_0p3_s2"]
    assert spec["jer_regulariser"]["weight"] == 1e-9
    assert {k: v for k, v in spec.items() if k != "jer_regulariser"} == {
        k: v for k, v in dose.items() if k != "jer_regulariser"
    }


def test_a_replicate_run_without_the_null_push_is_refused() -> None:
    config = copy.deepcopy(load_config(REPO / "config/config.yaml"))
    config["zoo"]["objectives"]["dose_replicate_1_s0"]["jer_regulariser"]["weight"] = 0.01
    with pytest.raises(ConfigError, match=r"lambda 1, seed 0\): jer_regulariser.weight is 0.01"):
        check_replicate_config(config)
