"""Training on synthetic concepts: recovery, the identifiability point, anchoring (repdiag.alignment)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from repdiag.alignment.concepts import SyntheticConcepts, synthetic_pairs
from repdiag.alignment.methods import SAESettings, make_method
from repdiag.alignment.study import fit_and_evaluate
from repdiag.alignment.train import SAETrainSettings, _learning_rate, normalise, train_method
from repdiag.core.errors import ConfigError
from tests.alignment.tiny import DATA, EVALUATION, SAE, TRAIN

torch.set_num_threads(1)


def test_paired_methods_refuse_data_without_pairs():
    data, _ = normalise(
        synthetic_pairs(
            SyntheticConcepts.from_config(dict(**{**DATA, "n_train": 256})),
            paired_fraction=0.0,
            seed=0,
        )
    )
    with pytest.raises(ConfigError, match="needs paired rows"):
        train_method(
            make_method("crosscoder", SAESettings.from_config(dict(**SAE))),
            data,
            SAETrainSettings.from_config(dict(steps=2)),
            seed=0,
        )
    with pytest.raises(ConfigError, match="needs anchor pairs"):
        fit_and_evaluate(
            "usae",
            replace(data, n_paired=0),
            sae=SAE,
            train=TRAIN,
            weights=None,
            evaluation=EVALUATION,
            seed=0,
        )


def test_learning_rate_is_constant_then_decays_linearly_to_zero():
    settings = SAETrainSettings.from_config(dict(steps=100, lr=0.01, decay_fraction=0.3))
    assert _learning_rate(settings, 0) == pytest.approx(0.01)
    assert _learning_rate(settings, 69) == pytest.approx(0.01)
    assert _learning_rate(settings, 70) == pytest.approx(0.01)
    assert _learning_rate(settings, 85) == pytest.approx(0.005)
    assert _learning_rate(settings, 99) == pytest.approx(0.01 / 30)
