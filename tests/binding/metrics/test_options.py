"""Metric options: schema defaults, nested merges and cross-key checks (repdiag.binding.metrics.options)."""

from __future__ import annotations

import pytest

from repdiag.binding.metrics.options import check_metrics_config
from repdiag.core.errors import ConfigError


@pytest.mark.parametrize(
    ("metrics", "n_pairs", "message"),
    [
        ({"geometry": {"l_iso_k": [50]}}, 20, r"metrics\.geometry\.l_iso_k: k=50"),
        ({"reference": {"max_size": 30}, "geometry": {"l_iso_k": [30]}}, 256, "k=30"),
        ({"readouts": {"knn": {"k": 600}}}, 256, r"metrics\.readouts\.knn\.k=600"),
        ({"readouts": {"local_pca": {"k": 5, "dim": 5}}}, 256, r"local_pca\.dim=5"),
        ({"probe": {"folds": 6}, "geometry": {"l_iso_k": [3]}}, 10, r"metrics\.probe\.folds=6"),
        (
            {"probe": {"folds": 2, "inner_folds": 6}, "geometry": {"l_iso_k": [3]}},
            20,
            r"metrics\.probe\.inner_folds=6 exceeds the 5 pairs",
        ),
    ],
)
def test_semantic_checks_name_the_key(metrics: dict, n_pairs: int, message: str) -> None:
    config = {"metrics": metrics, "datasets": {"binding": {"n_pairs": n_pairs}}}
    with pytest.raises(ConfigError, match=message):
        check_metrics_config(config)
    check_metrics_config({"metrics": {}, "datasets": {"binding": {"n_pairs": 256}}})


def test_metric_options_default_to_the_schema_and_merge_nested():
    from repdiag.binding.metrics.options import merge_options
    from repdiag.core.config import schema_defaults

    assert merge_options(None) == schema_defaults("metrics")
    merged = merge_options({"readouts": {"knn": {"k": 3}}})
    assert merged["readouts"]["knn"] == {"k": 3, "weights": "similarity"}
    assert merged["probe"] == schema_defaults("metrics")["probe"]
