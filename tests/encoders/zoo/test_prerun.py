"""Pre-run checks of the zoo: backbones built on the meta device (repdiag.encoders.zoo.prerun)."""

from __future__ import annotations

import json
import time

import pytest

from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo import prerun
from repdiag.encoders.zoo.spec import run_spec
from tests.encoders.zoo.conftest import tiny_config


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REPDIAG_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_heads": 3}, "AssertionError: dim should be divisible by num_heads"),
        ({"dept": 2}, "unexpected keyword argument 'dept'"),
    ],
)
def test_a_backbone_timm_cannot_build_is_refused_naming_the_key(kwargs, message):
    """Issue 36, case 10: what timm refuses is a ConfigError naming
    zoo.backbones.<name>.timm_kwargs, before any job; only the runs of the given models count."""
    config = tiny_config()
    config["zoo"]["backbones"]["vit"]["timm_kwargs"].update(kwargs)
    with pytest.raises(ConfigError) as err:
        prerun.check_zoo_backbones(config)
    assert str(err.value).startswith(
        "zoo.backbones.vit.timm_kwargs: timm cannot build 'vit_tiny_patch16_224' with "
    )
    assert message in str(err.value)
    prerun.check_zoo_backbones(config, models={"simmim"})  # only the ResNet is trained for it
    prerun.check_zoo_backbones(config, models=set())
    assert (
        not prerun.built_before_path().is_file()
        or len(json.loads(prerun.built_before_path().read_text())) == 1
    )  # the ResNet only


def test_backbones_that_built_are_remembered_and_cost_well_under_a_second(monkeypatch):
    from repdiag.encoders.zoo.spec import zoo_runs

    config = tiny_config()
    prerun._build_on_meta(run_spec(config, "simclr"))  # imports timm and its objectives
    start = time.perf_counter()
    prerun.check_zoo_backbones(config)
    runs = len(zoo_runs(config))  # one per objective: the ViT, the ResNet for simmim
    assert (time.perf_counter() - start) / runs < 1.0
    assert len(json.loads(prerun.built_before_path().read_text())) == runs
    monkeypatch.setattr(prerun, "_build_on_meta", lambda spec: pytest.fail("built again"))
    prerun.check_zoo_backbones(config)
    config["zoo"]["backbones"]["vit"]["timm_kwargs"]["depth"] = 3  # another architecture
    with pytest.raises(pytest.fail.Exception, match="built again"):
        prerun.check_zoo_backbones(config)
