"""The stats settings: schema defaults and cross-key checks (repdiag.binding.analysis.options)."""

from __future__ import annotations

import pytest

from repdiag.binding.analysis.options import StatsSettings, check_stats_config
from repdiag.core.errors import ConfigError
from tests.binding.stats_fakes import fake_models


def test_settings_and_semantic_checks():
    settings = StatsSettings.from_config(
        {"seed": 5, "covariates": ["zs"], "jer_formula": "entropy"}
    )
    assert settings.draw_seed == 5 and settings.covariates == ("zs",)
    assert settings.jer_column == "jer_entropy_final"
    assert settings.binding_column == "binding_cosine"  # accuracy, the schema's default
    win = StatsSettings.from_config({"readout": "knn", "binding_score": "win_rate"})
    assert win.binding_column == "binding_knn_win" and "win rate" in win.binding_label
    config = {"models": fake_models(2), "stats": {"covariates": ["zero_shot_accuracy"]}}
    check_stats_config(config)
    with pytest.raises(ConfigError, match=r"stats\.covariates: 'imagenet'"):
        check_stats_config({**config, "stats": {"covariates": ["imagenet"]}})
    with pytest.raises(ConfigError, match=r"stats\.readout"):
        check_stats_config(
            {**config, "stats": {"readout": "knn"}, "metrics": {"readouts": {"names": ["cosine"]}}}
        )
    clash = fake_models(1)
    clash["m00"]["covariates"] = {"jer_extra": 1.0}
    with pytest.raises(ConfigError, match=r"models\.m00\.covariates\.jer_extra"):
        check_stats_config({"models": clash, "stats": {}})


def test_stats_settings_take_every_value_from_the_config_or_the_schema():
    import dataclasses

    from repdiag.core.config import schema_defaults

    fields = dataclasses.fields(StatsSettings)
    assert all(f.default is dataclasses.MISSING for f in fields)  # no second home for a default
    schema = schema_defaults("stats")
    built = dataclasses.asdict(StatsSettings.from_config({}))
    assert built == {k: tuple(v) if isinstance(v, list) else v for k, v in schema.items()}
    assert StatsSettings.from_config({"seed": 3}).draw_seed == 3
    # null is resolved by the rules (seeded), once; a draw refuses it unresolved
    with pytest.raises(ConfigError, match=r"stats\.seed is None: resolve it"):
        StatsSettings.from_config({}).options()
    with pytest.raises(ConfigError, match=r"unknown key stats\.sede"):
        StatsSettings.from_config({"sede": 3})


def test_the_library_default_of_min_models_is_the_schemas():
    from repdiag.common.statistics import DEFAULT_MIN_MODELS

    assert StatsSettings.from_config({}).min_models == DEFAULT_MIN_MODELS
