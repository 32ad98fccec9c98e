"""Training on synthetic concepts: recovery, the identifiability point, anchoring (repdiag.alignment)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from repdiag.alignment.concepts import synthetic_pairs
from repdiag.alignment.grid import variant_terms
from repdiag.alignment.methods import SAESettings, make_method
from repdiag.alignment.study import fit_and_evaluate
from repdiag.alignment.train import TrainSettings, _learning_rate, normalise, train_method
from repdiag.core.errors import ConfigError

torch.set_num_threads(1)

DATA = dict(
    n_concepts=8,
    k_active=2,
    dims=[12, 16],
    maps=["linear", "nonlinear"],
    nonlinearity=0.5,
    noise=0.05,
    n_train=65536,
    n_test=1024,
)
SAE = dict(n_latents=16, k=2, aux_k=4, aux_coef=1 / 32, dead_after=2048)
TRAIN = dict(steps=600, batch_size=128, pair_batch_size=64, lr=3e-3, sw_projections=16)
WEIGHTS = dict(
    reconstruction=1.0, translation=1.0, consistency=1.0, dist_translation=0.3, dist_consistency=0.3
)
EVALUATION = dict(sw_projections=128, probe_train_fraction=0.5)


def _run(variant: str, fraction: float, seed: int = 0) -> dict:
    data, _ = normalise(synthetic_pairs(**DATA, paired_fraction=fraction, seed=seed))
    weights = {t: WEIGHTS[t] for t in variant_terms(variant)} or None
    return fit_and_evaluate(
        variant, data, sae=SAE, train=TRAIN, weights=weights, evaluation=EVALUATION, seed=seed
    )


def test_cosae_with_full_pairing_recovers_the_ground_truth_concepts():
    summary = _run("cosae-all", 1.0)["summary"]
    assert summary["mcc"] > 0.9
    assert summary["explained_variance"] > 0.9
    assert summary["tr_r2"] > 0.9 and summary["jaccard"] > 0.9


def test_distributional_only_matches_laws_not_instances_and_anchors_repair_it():
    unanchored = _run("cosae-distributional", 0.0)
    summary = unanchored["summary"]
    assert unanchored["n_paired"] == 0
    # the pushforward law matches the target: SW far below the trivial translation's scale ...
    assert summary["sw_translation"] < 0.1 * summary["sw_scale"]
    # ... yet instances are translated to the wrong concepts
    assert summary["tr_r2"] < 0.2
    assert summary["jaccard"] < 0.3
    # 0.1% anchor pairs (66 of 65536) fix the instance-level alignment
    anchored = _run("cosae-all", 0.001)
    assert anchored["n_paired"] == 66
    assert anchored["summary"]["tr_r2"] > 0.8
    assert anchored["summary"]["jaccard"] > 0.8
    assert anchored["summary"]["tr_r2"] - summary["tr_r2"] > 0.8


def test_training_is_deterministic_given_the_seed():
    data, _ = normalise(synthetic_pairs(**{**DATA, "n_train": 512}, paired_fraction=0.5, seed=1))
    settings = TrainSettings(steps=15, batch_size=32, pair_batch_size=16)
    sae = SAESettings(**SAE)
    runs = [
        train_method(make_method("cosae", sae, sw_projections=4), data, settings, seed=3)
        for _ in range(2)
    ]
    for p, q in zip(runs[0].model.parameters(), runs[1].model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert runs[0].curve[-1]["step"] == 15


def test_paired_methods_refuse_data_without_pairs():
    data, _ = normalise(synthetic_pairs(**{**DATA, "n_train": 256}, paired_fraction=0.0, seed=0))
    with pytest.raises(ConfigError, match="needs paired rows"):
        train_method(
            make_method("crosscoder", SAESettings(**SAE)), data, TrainSettings(steps=2), seed=0
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
    settings = TrainSettings(steps=100, lr=0.01, decay_fraction=0.3)
    assert _learning_rate(settings, 0) == pytest.approx(0.01)
    assert _learning_rate(settings, 69) == pytest.approx(0.01)
    assert _learning_rate(settings, 70) == pytest.approx(0.01)
    assert _learning_rate(settings, 85) == pytest.approx(0.005)
    assert _learning_rate(settings, 99) == pytest.approx(0.01 / 30)
