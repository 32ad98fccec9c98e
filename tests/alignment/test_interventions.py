"""Intervention metrics against closed forms: the oracle and the exact translator score 1, a
translation that carries nothing or aligns at random scores about 0, and no score depends on
either domain's basis (repdiag.alignment.interventions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.alignment.metrics import evaluate_alignment
from tests.alignment.known import (
    AT_SCHEMA_DEFAULTS,
    KnownModel,
    perfect_pair,
    synthetic_probe_truth,
)


def test_intervention_metrics_of_the_true_dictionaries_are_one():
    from repdiag.alignment.interventions import intervention_metrics

    model, data = perfect_pair()
    result = intervention_metrics(model, data.test, data.truth)
    for key in ("tr_intervention", "tr_intervention_input", "cont_intervention", "concept_match"):
        assert result[key] == pytest.approx(1.0, abs=1e-4), key
    assert result["n_shared_concepts"] == 12
    summary = evaluate_alignment(
        model, data.test, labels=data.test_labels, truth=data.truth, **AT_SCHEMA_DEFAULTS
    )["summary"]
    assert summary["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["cont_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["mcc"] == pytest.approx(1.0, abs=1e-4)


def test_permuted_latents_score_near_zero_by_index_and_one_after_sae_a_matching():
    from repdiag.alignment.interventions import intervention_metrics
    from repdiag.alignment.methods import SAEAligned, SAESettings

    model, data = perfect_pair(seed=1)
    order = np.roll(np.arange(12), 5)  # no latent keeps its index
    model.saes[1].permute_latents(order)
    shuffled = intervention_metrics(model, data.test, data.truth)
    # index matching: the latent that carries c in one domain decodes another concept in the
    # other, and the two domains move different latents
    assert abs(shuffled["tr_intervention"]) < 0.15
    assert shuffled["cont_intervention"] == pytest.approx(0.0, abs=1e-6)
    assert shuffled["concept_match"] == 0.0
    # translating through the input cannot help either: the code lands on the wrong atoms
    assert abs(shuffled["tr_intervention_input"]) < 0.15
    # SAE-A's Hungarian matching on paired codes undoes the permutation
    sae_a = SAEAligned(
        SAESettings.from_config(dict(n_latents=12, k=3, aux_k=0, aux_coef=0.0, dead_after=10))
    )
    pairs = tuple(torch.as_tensor(x) for x in data.test)
    sae_a.finalise(model, pairs)
    matched = intervention_metrics(model, data.test, data.truth)
    for key in ("tr_intervention", "tr_intervention_input", "cont_intervention", "concept_match"):
        assert matched[key] == pytest.approx(1.0, abs=1e-4), key


def test_intervention_metrics_only_score_shared_concepts():
    from repdiag.alignment.interventions import intervention_metrics

    model, data = perfect_pair(seed=2, n_specific=3)
    result = intervention_metrics(model, data.test, data.truth)
    assert result["n_shared_concepts"] == 12
    assert result["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert result["cont_intervention"] == pytest.approx(1.0, abs=1e-4)


def test_probe_scored_interventions_of_the_true_dictionaries_are_near_one():
    from repdiag.alignment.interventions import intervention_metrics

    model, data = perfect_pair(seed=3)
    truth = synthetic_probe_truth(data)
    assert not truth.exact and len(truth.shared) == 12
    result = intervention_metrics(model, data.test, truth)
    # the latent's change is W_j[:, a] z_a, the probe's target the mean effect of a: they differ
    # by the magnitude's spread (U(0.5, 1.5)) and the other concepts' shift (k of n are active)
    assert result["tr_intervention"] > 0.9
    assert result["tr_intervention_input"] > 0.9
    assert result["cont_intervention"] > 0.9
    assert result["concept_match"] == 1.0
    accuracy = np.concatenate(truth.probe_accuracy)
    assert accuracy.min() > 0.95  # every attribute is linearly decodable in both domains
    summary = evaluate_alignment(
        model, data.test, labels=data.test_labels, truth=truth, **AT_SCHEMA_DEFAULTS
    )["summary"]
    assert summary["attribute_probe_accuracy"] == pytest.approx(accuracy.mean())
    assert summary["mcc"] is None  # attributes are not the embeddings' generative factors


def test_probe_scored_interventions_fall_to_zero_with_permuted_latents_and_sae_a_restores_them():
    from repdiag.alignment.interventions import intervention_metrics
    from repdiag.alignment.methods import SAEAligned, SAESettings

    model, data = perfect_pair(seed=4)
    truth = synthetic_probe_truth(data, seed=1)
    model.saes[1].permute_latents(np.roll(np.arange(12), 5))
    shuffled = intervention_metrics(model, data.test, truth)
    assert abs(shuffled["tr_intervention"]) < 0.2
    # the mean effect is not each row's change, so TopK moves a few other latents: about 0
    assert abs(shuffled["cont_intervention"]) < 0.1
    assert shuffled["concept_match"] == 0.0
    sae_a = SAEAligned(
        SAESettings.from_config(dict(n_latents=12, k=3, aux_k=0, aux_coef=0.0, dead_after=10))
    )
    sae_a.finalise(model, tuple(torch.as_tensor(x) for x in data.test))
    matched = intervention_metrics(model, data.test, truth)
    assert matched["tr_intervention"] > 0.9 and matched["cont_intervention"] > 0.9


def test_attributes_no_domain_decodes_leave_the_intervention_metrics_empty():
    from repdiag.alignment.interventions import intervention_metrics

    model, data = perfect_pair(seed=5)
    truth = synthetic_probe_truth(data, shuffle=True)  # fit rows' attributes shuffled
    assert len(truth.shared) == 0
    result = intervention_metrics(model, data.test, truth)
    assert result["tr_intervention"] is None and result["cont_intervention"] is None
    assert result["concept_match"] is None


def test_change_agreement_by_hand():
    from repdiag.alignment.interventions import change_agreement, pooled_agreement

    t = np.array([[1.0, 0.0]])
    assert pooled_agreement([change_agreement(t, t)]) == pytest.approx(1.0)
    assert pooled_agreement([change_agreement(np.array([[0.0, 1.0]]), t)]) == pytest.approx(0.0)
    assert pooled_agreement([change_agreement(-t, t)]) == pytest.approx(-1.0)
    assert pooled_agreement([change_agreement(0 * t, t)]) == pytest.approx(0.0)
    # half the magnitude: 1 - 0.25 / 1.25
    assert pooled_agreement([change_agreement(0.5 * t, t)]) == pytest.approx(0.8)
    assert pooled_agreement([]) is None


def _attribute_pair(rotation=None, seed: int = 5, d: int = 4):
    """Domain a: one-hot concepts through a random map; domain b: a in a rotated basis; 800
    rows, the first 400 to fit the attributes on, the others held out."""
    from repdiag.alignment.real_pairs import random_rotation

    rng = np.random.default_rng(seed)
    z = np.zeros((800, 3))
    z[np.arange(800), rng.integers(0, 3, 800)] = rng.uniform(0.5, 1.5, 800)
    a = rng.standard_normal((d, 3))
    q = random_rotation(d, seed) if rotation is None else rotation
    maps = [a, q.T @ a]  # x_b = x_a q
    return z, maps, [(z @ m.T).astype(np.float32) for m in maps]


class _DisjointModel(KnownModel):
    """Each domain's codes in latents of its own: a translation decodes nothing (the mean), as a
    translator fitted to broken pairs does."""

    def encode(self, i, x):
        z = super().encode(i, x)
        zeros = torch.zeros_like(z)
        return torch.cat([z, zeros] if i == 0 else [zeros, z], dim=1)

    def decode(self, j, z):
        width = z.shape[1] // 2
        return super().decode(j, z[:, :width] if j == 0 else z[:, width:])


def _attribute_truth(z, xs):
    """The attributes fitted on the first 400 rows, and the 400 held-out rows they score."""
    from repdiag.alignment.real_pairs import probe_truth

    fit, test = [x[:400] for x in xs], [x[400:] for x in xs]
    names = [f"c{c}" for c in range(z.shape[1])]
    return probe_truth(fit, [z[:400] > 0] * 2, test, z[400:] > 0, names, seed=0), test


def test_decoded_m_tr_is_one_for_the_exact_translator_of_the_rotation_control():
    from repdiag.alignment.interventions import intervention_metrics

    z, maps, xs = _attribute_pair()
    truth, test = _attribute_truth(z, xs)
    assert len(truth.shared) == 3
    result = intervention_metrics(KnownModel(maps), test, truth)
    assert result["tr_intervention"] == result["tr_intervention_decoded"]
    assert result["tr_intervention"] == pytest.approx(1.0, abs=1e-5)
    assert result["tr_intervention_probe"] == pytest.approx(1.0, abs=1e-5)
    assert result["cont_intervention"] == pytest.approx(1.0, abs=1e-5)


def test_decoded_m_tr_is_zero_when_translation_carries_nothing():
    from repdiag.alignment.interventions import intervention_metrics

    z, maps, xs = _attribute_pair()
    truth, test = _attribute_truth(z, xs)
    result = intervention_metrics(_DisjointModel(maps), test, truth)
    assert result["tr_intervention"] == pytest.approx(0.0, abs=1e-6)
    assert result["tr_intervention_probe"] == pytest.approx(0.0, abs=1e-6)
    assert result["cont_intervention"] == pytest.approx(0.0, abs=1e-6)


def test_decoded_m_tr_does_not_depend_on_either_domains_basis():
    from repdiag.alignment.interventions import intervention_metrics
    from repdiag.alignment.real_pairs import random_rotation

    z, maps, xs = _attribute_pair()
    half = KnownModel([maps[0], 0.7 * maps[1]])  # b decodes at 0.7x: an imperfect translator
    truth, test = _attribute_truth(z, xs)
    reference = intervention_metrics(half, test, truth)
    assert 0.5 < reference["tr_intervention"] < 0.99
    q = random_rotation(4, 11)
    rotated = [xs[0], (xs[1] @ q).astype(np.float32)]
    model = KnownModel([maps[0], 0.7 * (q.T @ maps[1])])
    truth, test = _attribute_truth(z, rotated)
    value = intervention_metrics(model, test, truth)
    for key in ("tr_intervention", "tr_intervention_probe", "cont_intervention"):
        assert value[key] == pytest.approx(reference[key], abs=1e-5), key


def test_latent_ablation_matches_on_signed_correlation_for_real_attributes():
    from repdiag.alignment.interventions import concept_latents

    concept = np.array([1, 0, 1, 0, 1, 0, 1, 0], dtype=float)[:, None]
    anti = 1.0 - concept[:, 0]  # fires when the attribute is absent: corr -1
    pro = concept[:, 0] + np.array([0.3, 0, 0, 0.2, 0, 0.1, 0.4, 0])  # corr about +0.9
    codes = np.stack([anti, pro], axis=1)
    present = np.array([True])
    assert concept_latents(codes, concept, present) == {0: 0}  # |corr|: the anti latent
    assert concept_latents(codes, concept, present, signed=True) == {0: 1}


class _RandomAlignment(KnownModel):
    """Each domain's own dictionary is exact, but b's codes sit in a random rotation ``p`` of a's:
    what a method that learned its alignment from shuffled pairs ends up with."""

    def __init__(self, maps, p):
        super().__init__(maps)
        self.p = torch.as_tensor(p, dtype=torch.float32)

    def encode(self, i, x):
        z = x @ torch.linalg.pinv(self.maps[i]).T
        return z @ self.p if i == 1 else z

    def decode(self, j, z):
        return (z @ self.p.T if j == 1 else z) @ self.maps[j].T


def test_a_random_alignment_scores_about_zero_within_its_closed_form_tolerance():
    """With a's effects ``t`` and a Haar rotation ``P`` of the d-dimensional code space, the
    translated change along ``u = t / ||t||^2`` is ``t P t / ||t||^2``: mean 0 and standard
    deviation ``1 / sqrt(d)``; over 3 attributes M_tr is about twice its mean, sd
    ``2 / sqrt(3 d)`` (0.072 at d = 256), and M_cont has sd about ``1 / sqrt(3 d)``."""
    from repdiag.alignment.interventions import intervention_metrics
    from repdiag.alignment.real_pairs import random_rotation

    d = 256
    z, maps, xs = _attribute_pair(d=d, seed=6)
    maps = [np.linalg.qr(np.random.default_rng(1).standard_normal((d, d)))[0] for _ in range(2)]
    xs = [(np.c_[z, np.zeros((800, d - 3))] @ m.T).astype(np.float32) for m in maps]
    truth, test = _attribute_truth(z, xs)
    assert len(truth.shared) == 3
    exact = intervention_metrics(_RandomAlignment(maps, np.eye(d)), test, truth)
    assert exact["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert exact["cont_intervention"] == pytest.approx(1.0, abs=1e-4)
    shuffled = intervention_metrics(_RandomAlignment(maps, random_rotation(d, 3)), test, truth)
    assert abs(shuffled["tr_intervention"]) < 0.25  # 3.5 sd
    assert abs(shuffled["cont_intervention"]) < 0.2  # 5 sd


def test_row_parts_pool_to_the_metrics_and_sit_on_the_scored_rows():
    from repdiag.alignment.interventions import intervention_metrics

    z, maps, xs = _attribute_pair()
    truth, test = _attribute_truth(z, xs)
    half = KnownModel([maps[0], 0.7 * maps[1]])
    result = intervention_metrics(half, test, truth)
    parts = result["row_parts"]
    assert set(parts) >= {"tr_intervention", "cont_intervention", "tr_intervention_probe"}
    for key, (error, total) in parts.items():
        assert error.shape == total.shape == (400,)
        assert 1 - error.sum() / total.sum() == pytest.approx(result[key], abs=1e-12), key
    # a row carrying no scored attribute contributes nothing
    assert np.all(parts["cont_intervention"][1][z[400:].max(axis=1) == 0] == 0)
