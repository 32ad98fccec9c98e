"""SugarCrepe's final outputs: none while off; when on, each scored model's result and the
tables and figure."""

from __future__ import annotations

from repdiag.sugarcrepe.outputs import final_outputs
from tests.planning import resolved_config


def test_off_builds_nothing_on_scores_each_listed_model() -> None:
    config = resolved_config()
    assert final_outputs(config) == {"sugarcrepe": []}
    config["sugarcrepe"] = {"enabled": True, "models": ["clip", "simclr"]}
    paths = final_outputs(config)["sugarcrepe"]
    assert paths[:2] == ["results/sugarcrepe/clip.json", "results/sugarcrepe/simclr.json"]
    assert "results/tables/models_sugarcrepe.csv" in paths and len(paths) == 7
