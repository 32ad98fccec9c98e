"""The units of the family comparison: objectives with their seeds nested, checkpoints in their
run, the untrained network once (repdiag.binding.analysis.units)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from repdiag.binding.analysis.units import (
    configuration,
    require_runs,
    require_units,
    run_labels,
    unit_labels,
    unit_means,
    with_units,
)
from repdiag.common.units import ReplicationError


def meta(objective: str, seed: int, **settings) -> dict:
    """A zoo run's meta.json as far as its configuration goes."""
    return {
        "objective": objective,
        "seed": seed,
        "run": f"{objective}_s{seed}",
        "backbone": "resnet",
        "timm_model": "resnet10t",
        "timm_kwargs": {},
        "steps": 300,
        "batch_size": 32,
        "lr": 0.001,
        "hparams": {},
        **settings,
    }


def row(model: str, family: str, run: dict, step: float | None = None, **values) -> dict:
    return {
        "model": model,
        "family": family,
        "seed": float(run["seed"]),
        "step": float(run.get("steps") if step is None else step),
        "configuration": configuration(run),
        **values,
    }


def test_the_configuration_leaves_out_the_seed_the_name_and_recorded_estimates():
    first = meta("simclr", 0, jer_regulariser={"weight": 0.01, "estimate_first": 3.0})
    second = meta("simclr", 1, jer_regulariser={"weight": 0.01, "estimate_first": 9.0})
    assert configuration(first) == configuration(second)
    assert json.loads(configuration(first))["jer_regulariser"] == {"weight": 0.01}
    assert configuration(meta("simclr", 0, steps=1000)) != configuration(first)


def test_units_name_objectives_and_the_settings_that_differ():
    table = pd.DataFrame(
        [
            row("simclr_s0", "contrastive", meta("simclr", 0)),
            row("simclr_s1", "contrastive", meta("simclr", 1)),
            row("simclr_1000_s0", "contrastive", meta("simclr", 0, steps=1000)),
            row("dino_s0", "clustering_distillation", meta("dino", 0)),
            row("slots", "binding_supervised", meta("supervised", 0, hparams={"label": "s"})),
            {"model": "oracle", "family": "control", "seed": math.nan, "step": math.nan},
        ]
    )
    assert unit_labels(table) == [
        "simclr [steps=300]",
        "simclr [steps=300]",
        "simclr [steps=1000]",
        "dino",
        "slots",  # an upper bound trained once is its own unit
        "oracle",
    ]
    runs = run_labels(table)
    assert runs[:3] == ["simclr [steps=300], seed 0", "simclr [steps=300], seed 1", runs[2]]
    assert runs[2] == "simclr [steps=1000], seed 0" and runs[5] == "oracle"


def test_one_objective_on_two_backbones_is_two_units():
    """The family comparison's second design (docs/binding.md): objective x backbone units. The
    configuration holds the backbone, so a ViT run and a ResNet run of one objective are two
    units, named by what differs, and their seeds stay nested in each."""
    vit = {"backbone": "vit", "timm_model": "vit_tiny_patch16_224"}
    table = pd.DataFrame(
        [
            row("clip_s0", "vision_language", meta("clip", 0)),
            row("clip_s1", "vision_language", meta("clip", 1)),
            row("clip_vit_s0", "vision_language", meta("clip", 0, **vit)),
        ]
    )
    labels = unit_labels(table)
    assert labels == ['clip [backbone="resnet"]'] * 2 + ['clip [backbone="vit"]']


def test_null_and_absent_settings_name_two_units_and_no_named_setting_is_spare():
    """A regulariser set to null and one given as a mapping are two configurations: two names
    (an absent setting shows as unset, never as null). A key that a later one makes redundant
    is dropped: steps alone tell (lr 0.001, 100 steps), (0.01, 200), (0.01, 300) apart."""
    table = pd.DataFrame(
        [
            row("p", "contrastive", meta("simclr", 0, jer_regulariser=None)),
            row("q", "contrastive", meta("simclr", 0, jer_regulariser={"weight": 0.3})),
        ]
    )
    first, second = unit_labels(table)
    assert first != second and "unset" in second and "null" in first
    table = pd.DataFrame(
        [
            row(f"r{i}", "contrastive", meta("simclr", 0, lr=lr, steps=steps))
            for i, (lr, steps) in enumerate([(0.001, 100), (0.01, 200), (0.01, 300)])
        ]
    )
    assert unit_labels(table) == ["simclr [steps=100]", "simclr [steps=200]", "simclr [steps=300]"]


def test_a_unit_is_named_by_the_fewest_settings_that_tell_it_apart():
    """The backbone and its timm keywords all differ, the backbone alone separates (named by it
    only); two settings that each separate only part of the configurations are both named."""
    resnet = {"timm_kwargs": {"channels": [32, 64], "depth": None}}
    vit = {"backbone": "vit", "timm_kwargs": {"channels": None, "depth": 6}}
    table = pd.DataFrame(
        [
            row("a", "contrastive", meta("simclr", 0, **resnet)),
            row("b", "contrastive", meta("simclr", 0, **vit)),
            row("c", "contrastive", meta("simclr", 0, lr=0.01, **vit)),
            row("d", "contrastive", meta("simclr", 0, steps=10, lr=0.01, **vit)),
        ]
    )
    assert unit_labels(table) == [
        'simclr [backbone="resnet", lr=0.001, steps=300]',
        'simclr [backbone="vit", lr=0.001, steps=300]',
        'simclr [backbone="vit", lr=0.01, steps=300]',
        'simclr [backbone="vit", lr=0.01, steps=10]',
    ]


def test_a_checkpoint_and_the_untrained_network_twice_are_refused_naming_the_rows():
    dose = meta("supervised", 0, hparams={"slot_weight": 1.0})
    table = pd.DataFrame(
        [
            row("dose_1_s0", "binding_dose", dose),
            row("dose_1_s0_step100", "binding_dose", dose, step=100),
            row("dose_1_s0_step0", "binding_dose", dose, step=0),
            row("random_resnet", "control", meta("supervised", 0, steps=0)),
        ]
    )
    with pytest.raises(ReplicationError) as err:
        require_runs(with_units(table), "the pooled table")
    message = str(err.value)
    assert "the pooled table" in message
    assert "dose_1_s0, dose_1_s0_step100" in message
    assert "untrained resnet10t, seed 0: dose_1_s0_step0, random_resnet" in message
    require_runs(with_units(table.iloc[[0, 3]]), "finals")  # one run each: accepted


def test_unit_means_average_the_seeds_of_an_objective():
    rng = np.random.default_rng(0)
    runs = [
        row(f"{o}_s{s}", "f", meta(o, s), jer=float(rng.normal()), binding=float(rng.random()))
        for o in ("a", "b", "c")
        for s in range(3 if o == "a" else 2)
    ]
    table = pd.DataFrame(runs)
    means = unit_means(table, "test").set_index("unit")
    assert list(means.index) == ["a", "b", "c"]
    assert list(means["n_runs"]) == [3, 2, 2] and list(means["n_seeds"]) == [3, 2, 2]
    for objective in "abc":
        seeds = table[table["model"].str.startswith(f"{objective}_")]
        assert means.loc[objective, "jer"] == pytest.approx(seeds["jer"].mean())
        assert means.loc[objective, "models"] == ";".join(seeds["model"])
    require_units(means.reset_index(), "the means")  # one row per unit: accepted
    with pytest.raises(ReplicationError, match=r"the fit: .*a: a_s0, a_s1, a_s2; b: b_s0, b_s1"):
        require_units(table, "the fit")


def test_pretrained_encoders_without_a_seed_are_units_and_every_correlation_checks_them():
    """A pretrained encoder has no seed (NaN) and no configuration: its own run and unit, in
    one block, accepted; the correlations over units take the units and refuse two seeds of
    one objective handed to them as two rows, naming them."""
    from repdiag.binding.analysis.units import comparison_units
    from repdiag.common import statistics as stats

    rng = np.random.default_rng(1)
    runs = [row(f"{o}_s{s}", "f", meta(o, s)) for o in "ab" for s in range(2)]
    pretrained = [{"model": m, "family": "clip", "seed": np.nan} for m in ("clip", "dinov2")]
    table = pd.DataFrame([*runs, *pretrained]).assign(jer=rng.normal(size=6), binding=rng.random(6))
    units = with_units(table)
    require_runs(units, "the models")  # NaN seeds of pretrained encoders: not a block key here
    means = unit_means(units, "the models")
    assert list(means["unit"]) == ["a", "b", "clip", "dinov2"]
    keyed = comparison_units(means)
    assert (keyed.unit, keyed.rows, set(keyed.block)) == (
        ("a", "b", "clip", "dinov2"),
        ("a", "b", "clip", "dinov2"),
        {"all"},
    )
    frame = stats.correlation_table(means, "binding", ["jer"], units=keyed, min_models=4)
    assert frame.loc[0, "n"] == 4
    assert frame.loc[0, "pearson_r"] == pytest.approx(
        np.corrcoef(means["jer"], means["binding"])[0, 1]
    )
    with pytest.raises(ReplicationError, match=r"correlation: .*\(objective\): a: a_s0, a_s1; b:"):
        stats.correlation_table(units, "binding", ["jer"], units=comparison_units(units))
