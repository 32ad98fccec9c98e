"""The model families every layer names: one definition, assigned by the zoo, read by binding."""

from __future__ import annotations

import repdiag.binding as binding
from repdiag.common import families
from repdiag.encoders.zoo.spec import run_family


def test_the_families_are_distinct_and_all_kept_apart() -> None:
    names = [
        families.CONTROL_FAMILY,
        families.BINDING_SUPERVISED_FAMILY,
        families.BINDING_DOSE_FAMILY,
        families.JER_INTERVENTION_FAMILY,
    ]
    assert len(set(names)) == 4 and tuple(names) == families.APART_FAMILIES
    assert binding.APART_FAMILIES is families.APART_FAMILIES  # re-exported, not redefined


def test_the_zoo_assigns_them_by_what_the_run_was_told() -> None:
    hparams = {"supervised": {"label": "shape_presence"}}
    run = {"objective": "supervised", "steps": 10}
    assert run_family("r", run, hparams) == "supervised"
    assert run_family("r", {**run, "steps": 0}, hparams) == families.CONTROL_FAMILY
    dosed = {**run, "hparams": {"slot_weight": 0.1}}
    assert run_family("r", dosed, hparams) == families.BINDING_DOSE_FAMILY
    slots = {**run, "hparams": {"label": "slot_shape"}}
    assert run_family("r", slots, hparams) == families.BINDING_SUPERVISED_FAMILY
    # a regularised dose run is the JER intervention's (binding_causal), not a dose
    regularised = {**dosed, "jer_regulariser": {"weight": -0.05}}
    assert run_family("r", regularised, hparams) == families.JER_INTERVENTION_FAMILY
