"""Settings built from their config section (repdiag.core.settings.FromConfig)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig


@dataclass(frozen=True)
class Tiny(FromConfig):
    SECTION = "study.train"

    steps: int = 10
    lr: float = 0.1


def test_from_config_takes_the_fields_and_keeps_the_defaults():
    assert Tiny.from_config({"steps": 3}) == Tiny(steps=3, lr=0.1)
    assert Tiny.from_config({}) == Tiny()


def test_an_unknown_key_is_refused_naming_the_section_key_and_fields():
    with pytest.raises(ConfigError, match=r"unknown key study\.train\.stpes: Tiny has lr, steps"):
        Tiny.from_config({"stpes": 3})


@pytest.mark.parametrize(
    ("path", "section"),
    [
        ("repdiag.alignment.train:SAETrainSettings", {"steps": 5, "sw_projections": 8}),
        ("repdiag.alignment.metrics:EvaluationSettings", {"sw_projections": 8}),
        ("repdiag.cifar.probe:LinearProbeSettings", {"C": 0.5, "batch_size": 16}),
        (
            "repdiag.alignment.methods:SAESettings",
            {"n_latents": 8, "k": 2, "aux_k": 0, "aux_coef": 0.0, "dead_after": 9},
        ),
        ("repdiag.cifar.train:SimCLRSettings", {"epochs": 2, "batch_size": 4}),
        ("repdiag.encoders.zoo.calibrate:PilotSettings", {"every": 5}),
        ("repdiag.identifiability.metrics:HeldOutSettings", {"n_samples": 64, "seed": 3}),
        ("repdiag.sugarcrepe.data:ScoringSettings", {"batch_size": 8, "seed": 1}),
        ("repdiag.binding.metrics.options:ReferenceSettings", {"max_size": 50}),
        (
            "repdiag.alignment.concepts:SyntheticConcepts",
            {
                "n_concepts": 4,
                "k_active": 1,
                "dims": [3, 3],
                "maps": ["linear", "linear"],
                "nonlinearity": 0.0,
                "noise": 0.0,
                "n_train": 8,
                "n_test": 4,
            },
        ),
    ],
)
def test_the_config_settings_build_from_their_section_and_refuse_a_stray_key(path, section):
    import importlib

    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    built = cls.from_config(section)
    for key, value in section.items():
        assert getattr(built, key) == (tuple(value) if isinstance(value, list) else value)
    with pytest.raises(ConfigError, match=rf"unknown key {cls.SECTION}\.nope"):
        cls.from_config({**section, "nope": 1})


@dataclass(frozen=True)
class FromSchema(FromConfig):
    """Fields without defaults of their own: the schema's ``cifar.train`` fills them."""

    SECTION = "cifar.train"

    epochs: int
    lr: float
    log_every: int


def test_the_schema_fills_what_the_section_leaves_out_and_only_the_fields():
    from repdiag.core.config import schema_defaults
    from repdiag.core.settings import schema_section

    train = schema_defaults("cifar")["train"]
    assert schema_section("cifar.train") == train and schema_section("cifar.nothing") == {}
    built = FromSchema.from_config({"lr": 0.5})
    assert built == FromSchema(epochs=train["epochs"], lr=0.5, log_every=train["log_every"])
    with pytest.raises(TypeError, match="log_every"):  # no schema default, no value: an error
        type("Bare", (FromSchema,), {"SECTION": "cifar.nothing"}).from_config(
            {"epochs": 1, "lr": 0.1}
        )


@dataclass(frozen=True)
class Inner(FromConfig):
    SECTION = "metrics.readouts.knn"

    k: int
    weights: str


@dataclass(frozen=True)
class Outer(FromConfig):
    """A section with a subsection field: built from its mapping, its own defaults filled."""

    SECTION = "metrics.readouts"

    names: tuple[str, ...]
    knn: Inner


def test_a_subsection_field_is_built_with_its_own_defaults_and_recorded_nested():
    from repdiag.core.config import schema_defaults

    readouts = schema_defaults("metrics")["readouts"]
    built = Outer.from_config({"knn": {"k": 3}})
    assert built.knn == Inner(k=3, weights=readouts["knn"]["weights"])
    assert built.names == tuple(readouts["names"])  # a config list held as a tuple
    assert built.to_config() == {
        "names": readouts["names"],
        "knn": {"k": 3, "weights": "similarity"},
    }
    assert Outer.from_config({"knn": built.knn}).knn is built.knn  # an object already built
    with pytest.raises(ConfigError, match=r"unknown key metrics\.readouts\.knn\.kk"):
        Outer.from_config({"knn": {"kk": 3}})


def test_a_star_stands_for_any_item_of_a_mapping_of_named_items():
    from repdiag.core.config import schema_defaults
    from repdiag.core.settings import schema_section

    regulariser = schema_section("zoo.objectives.*.jer_regulariser")
    assert regulariser == schema_defaults("zoo")["objectives"]["simclr"]["jer_regulariser"]
    assert regulariser == {"weight": 0.0, "images": 4, "probes": 2}
    assert (
        schema_section("zoo.objectives.*")["steps"]
        == schema_defaults("zoo")["objectives"]["simclr"]["steps"]
    )
