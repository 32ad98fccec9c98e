"""Jacobian options: schema defaults and cross-key checks (repdiag.binding.jacobian_options)."""

from __future__ import annotations

import pytest
import torch

from repdiag.binding.jacobian_options import check_jacobians_config
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError

torch.set_num_threads(1)


def test_config_defaults_and_semantic_checks():
    filled = fill_defaults({"jacobians": {}})["jacobians"]
    assert filled["method"] == "auto" and filled["k"] == 32 and filled["power_iters"] == 5
    assert filled["precision"] == "fp32"  # full float32 unless asked otherwise
    assert filled["probes"] == {
        "binding": {"n": 16},
        "noise": {"n": 8, "std": 0.25},
        "folder": {"path": None, "n": 16},
    }
    check_jacobians_config({"jacobians": filled, "datasets": {"binding": {"n_queries": 16}}})
    with pytest.raises(
        ConfigError,
        match=r"jacobians\.probes\.binding\.n = 16 exceeds datasets\.binding\.n_queries = 8",
    ):
        check_jacobians_config({"jacobians": filled, "datasets": {"binding": {"n_queries": 8}}})
    empty = fill_defaults({"jacobians": {"probes": {"binding": {"n": 0}, "noise": {"n": 0}}}})
    with pytest.raises(ConfigError, match="every probe set is empty"):
        check_jacobians_config(empty)
