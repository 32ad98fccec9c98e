"""The ``jacobians`` config: schema defaults, the engine settings read from it, cross-key checks
(repdiag.encoders.jacobian.options)."""

from __future__ import annotations

import pytest
import torch

from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError
from repdiag.encoders.jacobian.options import JacobianSettings, check_jacobians_config

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


def test_engine_settings_come_from_the_resolved_section_and_nowhere_else():
    """The engine has no defaults of its own: its settings are the section's, whose defaults are
    the schema's (the paper's k = 32 and q = 5, full float32), under the section's own names."""
    import inspect

    from repdiag.encoders.jacobian.cache import run_chunked
    from repdiag.encoders.jacobian.engine import jacobian_spectra
    from repdiag.encoders.jacobian.plan_costs import plan_model

    filled = fill_defaults({"jacobians": {}})["jacobians"]
    defaults = {"method": "auto", "k": 32, "power_iters": 5, "seed": 0, "batch_size": None,
                "precision": "fp32"}  # fmt: skip
    assert JacobianSettings.from_config(filled).engine() == defaults
    assert JacobianSettings.from_config({}) == JacobianSettings.from_config(filled)
    set_here = fill_defaults({"jacobians": {"k": 8, "method": "exact", "batch_size": 64}})
    settings = JacobianSettings.from_config(set_here["jacobians"])
    assert settings.engine() == defaults | {"k": 8, "method": "exact", "batch_size": 64}
    assert (settings.chunk_size, settings.layers, settings.formulas) == (
        8,
        (),
        ("pr", "pr2", "entropy"),
    )  # config lists held as tuples
    # every engine keyword is the section's key of that name, and no section key is left out
    assert set(inspect.signature(jacobian_spectra).parameters) >= set(settings.engine())
    with pytest.raises(ConfigError, match=r"unknown key jacobians\.kk"):
        JacobianSettings.from_config({"kk": 8})
    for fn, names in (
        (jacobian_spectra, ("method", "k", "power_iters", "seed", "precision")),
        (run_chunked, ("chunk_size",)),
        (plan_model, ("method", "k", "power_iters", "batch_size", "chunk_size")),
    ):
        parameters = inspect.signature(fn).parameters
        assert all(parameters[name].default is inspect.Parameter.empty for name in names), fn


@pytest.mark.parametrize("name", ["nonexistent_layer", "block5", "Final", "stage", "layer4"])
def test_a_layer_name_no_encoder_has_is_refused_naming_the_key(name):
    """Issue 36, case 10: taps are named by repdiag.encoders.taps only."""
    config = fill_defaults({"jacobians": {"layers": ["final", name]}})
    with pytest.raises(ConfigError, match=rf"jacobians\.layers\[1\]: '{name}' is not a tap any"):
        check_jacobians_config(config)


def test_the_tap_name_pattern_admits_every_name_the_taps_give():
    import timm

    from repdiag.encoders.jacobian.options import TAP_NAME
    from repdiag.encoders.taps import tap_plan

    config = fill_defaults({"jacobians": {"layers": ["block00", "block123", "stage3", "head"]}})
    check_jacobians_config(config)
    with torch.device("meta"):
        vit = timm.create_model("vit_tiny_patch16_224", depth=2, embed_dim=32, num_heads=2)
        resnet = timm.create_model("resnet10t", num_classes=0)
    for model in (vit, resnet):
        layers = tap_plan(model).layers if model is vit else tap_plan(model, "mean").layers
        assert all(TAP_NAME.match(name) for name in layers), layers


def test_the_probe_folder_is_read_only_when_probes_come_from_it():
    probes = {"folder": {"path": "/data/images", "n": 0}}
    section = fill_defaults({"jacobians": {"probes": probes}})["jacobians"]
    assert JacobianSettings.from_config(section).probe_folder() is None
    assert JacobianSettings.from_config(section).probe_counts() == {
        "binding": 16, "noise": 8, "folder": 0}  # fmt: skip
    section["probes"]["folder"]["n"] = 8
    assert JacobianSettings.from_config(section).probe_folder() == "/data/images"
    assert JacobianSettings.from_config(section).probe_counts()["folder"] == 8
    section["probes"]["folder"]["path"] = None
    assert JacobianSettings.from_config(section).probe_counts()["folder"] == 0
