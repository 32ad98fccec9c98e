"""Metric settings: schema defaults at every depth and cross-key checks (repdiag.binding.metrics.options)."""

from __future__ import annotations

import pytest

from repdiag.binding.metrics.options import KnnSettings, MetricsSettings, check_metrics_config
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


def test_metric_settings_take_the_schema_defaults_at_every_depth_and_record_as_given():
    from repdiag.core.config import schema_defaults

    assert MetricsSettings.from_config({}).to_config() == schema_defaults("metrics")
    settings = MetricsSettings.from_config({"readouts": {"knn": {"k": 3}}})
    assert settings.readouts.knn == KnnSettings(k=3, weights="similarity")
    assert settings.readouts.keywords("knn") == {"k": 3, "weights": "similarity"}
    assert settings.readouts.keywords("cosine") == {}
    assert settings.probe == MetricsSettings.from_config({}).probe
    recorded = settings.to_config()
    assert recorded["readouts"]["knn"] == {"k": 3, "weights": "similarity"}
    assert list(recorded) == list(schema_defaults("metrics"))  # the schema's order, as before


def test_a_stray_key_at_any_depth_is_refused_by_its_full_name():
    with pytest.raises(ConfigError, match=r"unknown key metrics\.readouts\.knn\.kk"):
        MetricsSettings.from_config({"readouts": {"knn": {"kk": 3}}})
