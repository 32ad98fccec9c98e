"""Pre-run checks of the zoo: backbones built on the meta device (repdiag.encoders.zoo.prerun)."""

from __future__ import annotations

import json

import pytest

from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo import prerun
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


def test_backbones_are_built_on_meta_once_and_remembered(monkeypatch):
    """Cheap by construction, whatever the machine's speed: every backbone the check builds
    allocates nothing (all its parameters on the meta device), and one that built is not built
    again."""
    from repdiag.encoders.zoo import backbones
    from repdiag.encoders.zoo.spec import zoo_runs

    devices: list[set[str]] = []
    build = backbones.build_backbone

    def recording(*args, **kwargs):
        model = build(*args, **kwargs)
        devices.append({p.device.type for p in model.parameters()})
        return model

    monkeypatch.setattr(backbones, "build_backbone", recording)
    config = tiny_config()
    prerun.check_zoo_backbones(config)
    runs = len(zoo_runs(config))  # one per objective: the ViT, the ResNet for simmim
    assert devices == [{"meta"}] * runs
    assert len(json.loads(prerun.built_before_path().read_text())) == runs
    monkeypatch.setattr(prerun, "_build_on_meta", lambda spec: pytest.fail("built again"))
    prerun.check_zoo_backbones(config)
    config["zoo"]["backbones"]["vit"]["timm_kwargs"]["depth"] = 3  # another architecture
    with pytest.raises(pytest.fail.Exception, match="built again"):
        prerun.check_zoo_backbones(config)
