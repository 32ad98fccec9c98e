"""Learning-rate selection on a validation split (repdiag.alignment.tuning)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.alignment.concepts import SyntheticConcepts, synthetic_pairs
from repdiag.alignment.grid import tuning_params
from repdiag.alignment.methods import SAESettings, make_method, squared_error
from repdiag.alignment.train import normalise
from repdiag.alignment.tuning import (
    lr_table,
    pick_learning_rate,
    tune_learning_rate,
    validation_objective,
    validation_split,
)
from repdiag.core.errors import ConfigError

SMALL = dict(
    n_concepts=6,
    k_active=2,
    dims=[8, 10],
    maps=["linear", "nonlinear"],
    nonlinearity=0.5,
    noise=0.05,
    n_train=4000,
    n_test=256,
)
SAE = dict(n_latents=12, k=2, aux_k=4, aux_coef=1 / 32, dead_after=1024)


def test_validation_split_holds_out_the_last_rows_and_pairs_and_keeps_pairs_first():
    data = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=0.05, seed=0
    )  # 200 pairs
    train, rows, pairs = validation_split(data, 0.1)
    assert data.n_paired == 200 and train.n_paired == 180 and len(pairs[0]) == 20
    for i in range(2):
        assert len(rows[i]) == 380  # 10% of the 3800 unpaired rows
        assert len(train.train[i]) == 4000 - 380 - 20
        np.testing.assert_array_equal(train.train[i][:180], data.train[i][:180])
        np.testing.assert_array_equal(pairs[i], data.train[i][180:200])
        np.testing.assert_array_equal(rows[i], data.train[i][-380:])
    # the held-out rows are not among the training rows, and pairs stay pairs
    held = {tuple(r) for r in np.concatenate([rows[0], pairs[0]])}
    assert not held & {tuple(r) for r in train.train[0]}
    np.testing.assert_array_equal(data.train_concepts[0][180:200], data.train_concepts[1][180:200])
    with pytest.raises(ConfigError, match="validation_fraction"):
        validation_split(data, 1.0)
    one_pair = synthetic_pairs(
        SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=1 / 4000, seed=0
    )
    assert validation_split(one_pair, 0.1)[2] is None  # a single pair stays in training


def test_validation_objective_of_independent_saes_is_their_reconstruction_error():
    data, _ = normalise(
        synthetic_pairs(SyntheticConcepts.from_config(dict(**SMALL)), paired_fraction=0.05, seed=1)
    )
    method = make_method("independent", SAESettings.from_config(dict(**SAE)))
    model = method.build([8, 10], torch.Generator().manual_seed(0))
    rows = tuple(x[:300] for x in data.train)
    scores = validation_objective(method, model, rows, None, seed=0)
    with torch.no_grad():
        expected = sum(
            float(
                squared_error(
                    model.decode(i, model.encode(i, torch.as_tensor(x))), torch.as_tensor(x)
                )
            )
            for i, x in enumerate(rows)
        )
    assert scores["objective"] == pytest.approx(expected, rel=1e-5)
    assert set(scores) == {"objective", "reconstruction"}  # AuxK is not part of it
    crosscoder = make_method("crosscoder", SAESettings.from_config(dict(**SAE)))
    with pytest.raises(ConfigError, match="validation pairs"):
        validation_objective(
            crosscoder, crosscoder.build([8, 10], torch.Generator()), rows, None, seed=0
        )


def _alignment(lrs):
    return {
        "preset": "none",
        "synthetic": SMALL,
        "sae": SAE,
        "train": {
            "steps": 150,
            "batch_size": 64,
            "pair_batch_size": 32,
            "lr": 1e-3,
            "decay_fraction": 0.3,
            "sw_projections": 8,
        },
        "weights": {
            "reconstruction": 1.0,
            "translation": 1.0,
            "consistency": 1.0,
            "dist_translation": 0.3,
            "dist_consistency": 0.3,
        },
        "tuning": {
            "enabled": True,
            "lrs": lrs,
            "validation_fraction": 0.1,
            "paired_fraction": 0.05,
            "seed": 0,
        },
        "grid": {
            "methods": ["cosae"],
            "ablations": ["all"],
            "paired_fractions": [0.05],
            "seeds": [0],
        },
    }


def test_a_learning_rate_too_small_to_train_is_not_picked():
    params = tuning_params(_alignment([1e-6, 3e-3]), "cosae-all")
    assert params["train"]["lr"] == 1e-3 and "enabled" not in params["tuning"]
    result = tune_learning_rate(params)
    objectives = {run["lr"]: run["validation"]["objective"] for run in result["runs"]}
    assert result["picked_lr"] == min(objectives, key=objectives.get) == 3e-3
    assert objectives[1e-6] > 1.5 * objectives[3e-3]  # an untrained SAE reconstructs badly
    assert {"reconstruction", "translation", "consistency"} <= set(result["runs"][0]["validation"])
    assert result["n_validation_pairs"] == 20 and result["n_train_pairs"] == 180
    table = lr_table([result])
    assert list(table["picked"]) == [False, True] and list(table["is_default"]) == [False, False]
    assert result["picked_at_edge"] and table["picked_at_range_end"].all()


def _runs(objectives):
    return [{"lr": lr, "validation": {"objective": v}} for lr, v in objectives.items()]


def test_a_diverged_rate_is_never_picked_and_an_interior_pick_is_not_at_the_edge():
    assert pick_learning_rate(_runs({1e-3: 0.5, 3e-3: 0.2, 1e-2: None}), "usae") == (3e-3, False)
    assert pick_learning_rate(_runs({1e-3: 0.5, 3e-3: 0.2, 1e-2: 0.3}), "usae") == (3e-3, False)
    assert pick_learning_rate(_runs({1e-3: 0.5, 3e-3: float("nan"), 1e-2: 0.7}), "usae") == (
        1e-3,
        True,
    )


def test_a_pick_at_either_end_of_the_range_is_flagged(caplog):
    with caplog.at_level("WARNING"):
        assert pick_learning_rate(_runs({1e-2: 0.1, 1e-3: 0.5, 3e-3: 0.2}), "cosae-all") == (
            1e-2,
            True,
        )
    assert "at the end of alignment.tuning.lrs" in caplog.text


def test_every_rate_diverged_is_an_error():
    with pytest.raises(FloatingPointError, match="every learning rate diverged"):
        pick_learning_rate(_runs({1e-3: None, 1e-2: float("inf")}), "crosscoder")


def test_tuning_params_and_config_check_name_the_key():
    from repdiag.alignment.grid import check_alignment_config

    with pytest.raises(ConfigError, match="not in the grid"):
        tuning_params(_alignment([1e-3, 3e-3]), "usae")
    alignment = _alignment([1e-3, 3e-3])
    alignment["tuning"]["paired_fraction"] = 1e-4  # 0.4 of a pair of 4000 rows: 1 pair
    with pytest.raises(ConfigError, match=r"alignment\.tuning\.paired_fraction"):
        check_alignment_config({"alignment": alignment, "models": {}})
