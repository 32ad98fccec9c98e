"""Alignment metrics against values computed by hand on tiny arrays (repdiag.alignment.metrics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.alignment.metrics import (
    active_jaccard,
    code_correlation,
    dead_latents,
    evaluate_alignment,
    explained_variance,
    l0,
    mcc,
    mean_cosine,
    probe_transfer,
    r2_score,
    sliced_wasserstein_np,
    total_variance,
)


def test_r2_by_hand():
    target = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])  # mean (1, 1)
    prediction = np.array([[1.0, 1.0], [0.0, 1.0], [2.0, 2.0]])
    # residual: 1; total: (0 + 1) + (1 + 0) + (1 + 1) = 4
    assert r2_score(target, prediction) == pytest.approx(1 - 1 / 4)
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert r2_score(target, np.ones_like(target)) == pytest.approx(0.0)  # the mean: R2 = 0
    assert total_variance(target) == pytest.approx(4 / 3)


def test_cosine_by_hand():
    prediction = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    target = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
    assert mean_cosine(prediction, target) == pytest.approx((1 + 1 / np.sqrt(2) + 0) / 3)


def test_l0_and_dead_latents_on_a_constructed_case():
    codes = np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    assert l0(codes) == pytest.approx((2 + 1 + 1) / 3)
    assert dead_latents(codes) == 2  # latents 1 and 3 never fire


def test_mcc_is_one_for_permuted_scaled_concepts_and_matches_hand_value():
    rng = np.random.default_rng(0)
    concepts = rng.random((50, 3))
    codes = np.concatenate([3 * concepts[:, [2, 0, 1]], np.zeros((50, 1))], axis=1)
    assert mcc(codes, concepts) == pytest.approx(1.0)
    # two concepts, latents (c0, c0 + c1): the matching pairs latent 0 with c0 (corr 1)
    # and latent 1 with c1 (corr 1/sqrt(2) for independent equal-variance c0, c1)
    c = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    latents = np.stack([c[:, 0], c[:, 0] + c[:, 1]], axis=1)
    assert mcc(latents, c) == pytest.approx((1 + 1 / np.sqrt(2)) / 2)


def test_jaccard_by_hand():
    a = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    b = np.array([[0.0, 2.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # rows: {0,1} vs {1,2} -> 1/3; both empty -> 1; {2} vs {0} -> 0
    assert active_jaccard(a, b) == pytest.approx((1 / 3 + 1 + 0) / 3)


def test_code_correlation_by_hand():
    a = np.array([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [3.0, 0.0, 0.0], [4.0, 1.0, 0.0]])
    b = np.array([[2.0, 1.0, 0.0], [4.0, 0.0, 0.0], [6.0, 1.0, 0.0], [8.0, 0.0, 0.0]])
    # latent 0: corr 1; latent 1: corr -1; latent 2 unused in both: excluded
    assert code_correlation(a, b, weighted=False) == pytest.approx(0.0)
    # weighted by firing frequency: latent 0 fires on 100%, latent 1 on 50% of rows
    assert code_correlation(a, b) == pytest.approx((1.0 - 0.5) / 1.5)
    b[:, 1] = 0.0  # latent 1 constant in b: counts as 0
    assert code_correlation(a, b, weighted=False) == pytest.approx(0.5)
    assert code_correlation(a, b) == pytest.approx(1.0 / 1.25)  # weight of latent 1: 0.25


def test_probe_transfer_identical_and_scrambled_codes():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=400)
    codes = np.eye(4)[labels] * rng.uniform(1, 2, size=(400, 1))
    same = probe_transfer(codes, codes, labels, seed=0)
    assert same["source"] == pytest.approx(1.0)
    assert same["transfer"] == pytest.approx(1.0)
    scrambled = probe_transfer(codes, codes[:, [1, 2, 3, 0]], labels, seed=0)
    assert scrambled["source"] == pytest.approx(1.0)
    assert scrambled["transfer"] == pytest.approx(0.0)
    assert 0.2 < same["chance"] < 0.35


def test_sliced_wasserstein_of_a_shift_is_its_squared_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 3))
    shift = np.array([0.3, -0.4, 0.0])
    # E_theta (theta . t)^2 * d = ||t||^2 = 0.25; 4000 directions: within a few percent
    assert sliced_wasserstein_np(x, x + shift, 4000) == pytest.approx(0.25, rel=0.05)
    assert sliced_wasserstein_np(x, x[::-1], 64) == pytest.approx(0.0, abs=1e-12)


class _KnownModel:
    """A hand-made pair model: codes are the true concepts, decoders the true linear maps."""

    def __init__(self, maps, permutation=None):
        self.maps = [torch.as_tensor(m, dtype=torch.float32) for m in maps]
        self.permutation = permutation

    def encode(self, i, x):
        z = x @ torch.linalg.pinv(self.maps[i]).T
        z = torch.where(z.abs() < 1e-4, 0.0, z)  # float round-off is not an active latent
        if i == 1 and self.permutation is not None:
            z = z[:, self.permutation]
        return z

    def decode(self, j, z):
        if j == 1 and self.permutation is not None:
            return z @ self.maps[j][:, self.permutation].T
        return z @ self.maps[j].T

    def cycle(self, i, j, x):
        return self.decode(i, self.encode(j, self.decode(j, self.encode(i, x))))


def _known_case():
    rng = np.random.default_rng(1)
    z = np.zeros((200, 3))
    z[np.arange(200), rng.integers(0, 3, 200)] = rng.uniform(0.5, 1.5, 200)
    maps = [rng.standard_normal((4, 3)), rng.standard_normal((5, 3))]
    return z, maps, [(z @ m.T).astype(np.float32) for m in maps]


def test_evaluate_alignment_of_a_perfect_model():
    z, maps, test = _known_case()
    result = evaluate_alignment(_KnownModel(maps), test, labels=np.argmax(z, 1), concepts=z)
    summary = result["summary"]
    for key in ("explained_variance", "mcc", "tr_r2", "tr_cosine", "jaccard", "cycle_r2"):
        assert summary[key] == pytest.approx(1.0, abs=1e-4), key
    assert summary["probe_transfer"] == pytest.approx(summary["probe_source"])
    assert summary["l0"] == pytest.approx(1.0, abs=1e-4)
    assert summary["sw_translation"] < 1e-6
    assert set(result["translation"]) == {"a->b", "b->a"}
    assert set(result["cycle"]) == {"a->b->a", "b->a->b"}


def test_evaluate_alignment_sees_a_latent_permutation():
    z, maps, test = _known_case()
    permuted = _KnownModel(maps, permutation=[1, 2, 0])
    summary = evaluate_alignment(permuted, test, labels=np.argmax(z, 1), concepts=z)["summary"]
    assert summary["explained_variance"] == pytest.approx(1.0, abs=1e-4)  # each SAE is perfect
    assert summary["mcc"] == pytest.approx(1.0, abs=1e-4)
    assert summary["jaccard"] == pytest.approx(0.0, abs=1e-6)  # one-hot codes on other latents
    assert summary["tr_r2"] < 0.0
    assert summary["probe_transfer"] < 0.5 < summary["probe_source"]


# intervention metrics ---------------------------------------------------------------------------
def _perfect_pair(seed=0, n_specific=0):
    """The true dictionaries as two TopK SAEs (encoder = pinv(W), k = k_active), linear, noiseless."""
    from repdiag.alignment.concepts import synthetic_pairs
    from repdiag.alignment.methods import PairModel
    from repdiag.alignment.topk import TopKSAE

    data = synthetic_pairs(
        n_concepts=12,
        k_active=3,
        dims=[64, 80],
        maps=["linear", "linear"],
        nonlinearity=0.0,
        noise=0.0,
        n_train=512,
        n_test=600,
        paired_fraction=1.0,
        seed=seed,
        n_specific=n_specific,
    )
    saes = []
    for domain_map in data.truth.maps:
        w = torch.as_tensor(domain_map.dictionary)
        sae = TopKSAE(w.shape[0], w.shape[1], 3)
        with torch.no_grad():
            sae.decoder.copy_(w)
            sae.encoder.copy_(torch.linalg.pinv(w))
            sae.b_dec.zero_()
            sae.b_enc.zero_()
        saes.append(sae)
    return PairModel(saes).eval(), data


def test_intervention_metrics_of_the_true_dictionaries_are_one():
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair()
    result = intervention_metrics(model, data.test, data.truth)
    for key in ("tr_intervention", "tr_intervention_input", "cont_intervention", "concept_match"):
        assert result[key] == pytest.approx(1.0, abs=1e-4), key
    assert result["n_shared_concepts"] == 12
    summary = evaluate_alignment(model, data.test, labels=data.test_labels, truth=data.truth)[
        "summary"
    ]
    assert summary["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["cont_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["mcc"] == pytest.approx(1.0, abs=1e-4)


def test_permuted_latents_score_near_zero_by_index_and_one_after_sae_a_matching():
    from repdiag.alignment.methods import SAEAligned, SAESettings
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair(seed=1)
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
    sae_a = SAEAligned(SAESettings(n_latents=12, k=3, aux_k=0, aux_coef=0.0, dead_after=10))
    pairs = tuple(torch.as_tensor(x) for x in data.test)
    sae_a.finalise(model, pairs)
    matched = intervention_metrics(model, data.test, data.truth)
    for key in ("tr_intervention", "tr_intervention_input", "cont_intervention", "concept_match"):
        assert matched[key] == pytest.approx(1.0, abs=1e-4), key


def test_intervention_metrics_only_score_shared_concepts():
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair(seed=2, n_specific=3)
    result = intervention_metrics(model, data.test, data.truth)
    assert result["n_shared_concepts"] == 12
    assert result["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert result["cont_intervention"] == pytest.approx(1.0, abs=1e-4)


def _probe_truth(data, seed=0):
    """The synthetic concepts as known binary attributes, as the real-embedding path sees them."""
    from repdiag.alignment.concepts import probe_truth

    names = [f"c{c}" for c in range(data.test_concepts.shape[1])]
    return probe_truth(data.test, data.test_concepts > 0, names, fit_fraction=0.5, seed=seed)


def test_probe_scored_interventions_of_the_true_dictionaries_are_near_one():
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair(seed=3)
    truth = _probe_truth(data)
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
    summary = evaluate_alignment(model, data.test, labels=data.test_labels, truth=truth)["summary"]
    assert summary["attribute_probe_accuracy"] == pytest.approx(accuracy.mean())
    assert summary["mcc"] is None  # attributes are not the embeddings' generative factors


def test_probe_scored_interventions_fall_to_zero_with_permuted_latents_and_sae_a_restores_them():
    from repdiag.alignment.methods import SAEAligned, SAESettings
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair(seed=4)
    truth = _probe_truth(data, seed=1)
    model.saes[1].permute_latents(np.roll(np.arange(12), 5))
    shuffled = intervention_metrics(model, data.test, truth)
    assert abs(shuffled["tr_intervention"]) < 0.2
    assert abs(shuffled["cont_intervention"]) < 0.05
    assert shuffled["concept_match"] == 0.0
    sae_a = SAEAligned(SAESettings(n_latents=12, k=3, aux_k=0, aux_coef=0.0, dead_after=10))
    sae_a.finalise(model, tuple(torch.as_tensor(x) for x in data.test))
    matched = intervention_metrics(model, data.test, truth)
    assert matched["tr_intervention"] > 0.9 and matched["cont_intervention"] > 0.9


def test_probe_truth_effects_and_probes_by_hand():
    from repdiag.alignment.concepts import probe_truth

    rng = np.random.default_rng(0)
    labels = (np.arange(200) % 2).astype(np.float32)[:, None]  # one attribute, half the rows
    direction = np.array([3.0, 0.0, 0.0])
    x = labels * direction + 0.01 * rng.standard_normal((200, 3))
    rare = np.zeros((200, 1), dtype=np.float32)
    rare[:3] = 1  # fewer than MIN_CLASS_ROWS positives in the fit half: not scored
    unseen = (rng.random((200, 1)) < 0.5).astype(np.float32)  # not in the inputs: chance probes
    truth = probe_truth(
        (x, 2 * x),
        np.concatenate([labels, rare, unseen], axis=1),
        ["half", "rare", "unseen"],
        seed=0,
    )
    assert truth.probe_accuracy[0][2] < 0.6 and not truth.present[0][2]
    np.testing.assert_allclose(truth.effects[0][0], direction, atol=0.01)
    np.testing.assert_allclose(truth.effects[1][0], 2 * direction, atol=0.02)
    assert truth.probes[0][0][0] > 0 and truth.probe_accuracy[0][0] == 1.0
    assert list(truth.shared) == [0]
    assert len(np.intersect1d(truth.fit_rows, truth.eval_rows)) == 0
    assert len(truth.fit_rows) + len(truth.eval_rows) == 200
    rows = truth.rows(0, max_rows=1000)
    assert set(rows) <= set(truth.eval_rows) and np.all(labels[rows, 0] == 1)
    # scaling the inputs (repdiag.alignment.train.normalise) rescales effects, keeps w . t
    from dataclasses import replace

    scaled = replace(truth, scales=(2.0, 1.0))
    np.testing.assert_allclose(scaled.change(0, rows[:2], 0)[0], truth.effects[0][0] / 2)
    assert scaled.readout(0, 0) @ scaled.change(0, rows[:1], 0)[0] == pytest.approx(
        truth.readout(0, 0) @ truth.change(0, rows[:1], 0)[0], rel=1e-5
    )


def test_attributes_no_domain_decodes_leave_the_intervention_metrics_empty():
    from repdiag.alignment.concepts import probe_truth
    from repdiag.alignment.metrics import intervention_metrics

    model, data = _perfect_pair(seed=5)
    shuffled = np.random.default_rng(0).permutation(data.test_concepts > 0)  # rows shuffled
    truth = probe_truth(data.test, shuffled, [f"c{c}" for c in range(12)], seed=0)
    assert len(truth.shared) == 0
    result = intervention_metrics(model, data.test, truth)
    assert result["tr_intervention"] is None and result["cont_intervention"] is None
    assert result["concept_match"] is None


def test_change_agreement_by_hand():
    from repdiag.alignment.metrics import change_agreement, pooled_agreement

    t = np.array([[1.0, 0.0]])
    assert pooled_agreement([change_agreement(t, t)]) == pytest.approx(1.0)
    assert pooled_agreement([change_agreement(np.array([[0.0, 1.0]]), t)]) == pytest.approx(0.0)
    assert pooled_agreement([change_agreement(-t, t)]) == pytest.approx(-1.0)
    assert pooled_agreement([change_agreement(0 * t, t)]) == pytest.approx(0.0)
    # half the magnitude: 1 - 0.25 / 1.25
    assert pooled_agreement([change_agreement(0.5 * t, t)]) == pytest.approx(0.8)
    assert pooled_agreement([]) is None


def test_weighted_code_correlation_discounts_rare_latents():
    a = np.zeros((100, 2))
    a[:, 0] = np.arange(100) % 7 + 1.0  # fires on every row, identical in both domains
    b = a.copy()
    a[0, 1], b[1, 1] = 1.0, 1.0  # fires once in each domain, on different rows: corr ~ -0.01
    rare = np.corrcoef(a[:, 1], b[:, 1])[0, 1]
    assert code_correlation(a, b, weighted=False) == pytest.approx((1 + rare) / 2)
    # weights: latent 0 fires on 100% of rows, latent 1 on 1%
    assert code_correlation(a, b) == pytest.approx((1.0 * 1 + 0.01 * rare) / 1.01)


def _attribute_pair(rotation=None, seed: int = 5):
    """Domain a: one-hot concepts through a random map; domain b: a in a rotated basis."""
    from repdiag.alignment.concepts import random_rotation

    rng = np.random.default_rng(seed)
    z = np.zeros((400, 3))
    z[np.arange(400), rng.integers(0, 3, 400)] = rng.uniform(0.5, 1.5, 400)
    a = rng.standard_normal((4, 3))
    q = random_rotation(4, seed) if rotation is None else rotation
    maps = [a, q.T @ a]  # x_b = x_a q
    return z, maps, [(z @ m.T).astype(np.float32) for m in maps]


class _DisjointModel(_KnownModel):
    """Each domain's codes in latents of its own: a translation decodes nothing (the mean), as a
    translator fitted to broken pairs does."""

    def encode(self, i, x):
        z = super().encode(i, x)
        zeros = torch.zeros_like(z)
        return torch.cat([z, zeros] if i == 0 else [zeros, z], dim=1)

    def decode(self, j, z):
        width = z.shape[1] // 2
        return super().decode(j, z[:, :width] if j == 0 else z[:, width:])


def _attribute_truth(z, test):
    from repdiag.alignment.concepts import probe_truth

    return probe_truth(test, z > 0, [f"c{c}" for c in range(z.shape[1])], seed=0)


def test_decoded_m_tr_is_one_for_the_exact_translator_of_the_rotation_control():
    from repdiag.alignment.metrics import intervention_metrics

    z, maps, test = _attribute_pair()
    truth = _attribute_truth(z, test)
    assert len(truth.shared) == 3
    result = intervention_metrics(_KnownModel(maps), test, truth)
    assert result["tr_intervention"] == result["tr_intervention_decoded"]
    assert result["tr_intervention"] == pytest.approx(1.0, abs=1e-5)
    assert result["tr_intervention_probe"] == pytest.approx(1.0, abs=1e-5)
    assert result["cont_intervention"] == pytest.approx(1.0, abs=1e-5)


def test_decoded_m_tr_is_zero_when_translation_carries_nothing():
    from repdiag.alignment.metrics import intervention_metrics

    z, maps, test = _attribute_pair()
    result = intervention_metrics(_DisjointModel(maps), test, _attribute_truth(z, test))
    assert result["tr_intervention"] == pytest.approx(0.0, abs=1e-6)
    assert result["tr_intervention_probe"] == pytest.approx(0.0, abs=1e-6)


def test_decoded_m_tr_does_not_depend_on_either_domains_basis():
    from repdiag.alignment.concepts import random_rotation
    from repdiag.alignment.metrics import intervention_metrics

    z, maps, test = _attribute_pair()
    half = _KnownModel([maps[0], 0.7 * maps[1]])  # b decodes at 0.7x: an imperfect translator
    reference = intervention_metrics(half, test, _attribute_truth(z, test))["tr_intervention"]
    assert 0.5 < reference < 0.99
    q = random_rotation(4, 11)
    rotated = [test[0], (test[1] @ q).astype(np.float32)]
    model = _KnownModel([maps[0], 0.7 * (q.T @ maps[1])])
    value = intervention_metrics(model, rotated, _attribute_truth(z, rotated))["tr_intervention"]
    assert value == pytest.approx(reference, abs=1e-4)


def test_latent_ablation_matches_on_signed_correlation_for_real_attributes():
    from repdiag.alignment.metrics import concept_latents

    concept = np.array([1, 0, 1, 0, 1, 0, 1, 0], dtype=float)[:, None]
    anti = 1.0 - concept[:, 0]  # fires when the attribute is absent: corr -1
    pro = concept[:, 0] + np.array([0.3, 0, 0, 0.2, 0, 0.1, 0.4, 0])  # corr about +0.9
    codes = np.stack([anti, pro], axis=1)
    present = np.array([True])
    assert concept_latents(codes, concept, present) == {0: 0}  # |corr|: the anti latent
    assert concept_latents(codes, concept, present, signed=True) == {0: 1}
