"""Alignment metrics against values computed by hand on tiny arrays (repdiag.alignment.metrics)."""

from __future__ import annotations

import numpy as np
import pytest

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
from tests.alignment.known import AT_SCHEMA_DEFAULTS, KnownModel


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
    same = probe_transfer(codes, codes, labels, train_fraction=0.5, seed=0)
    assert same["source"] == pytest.approx(1.0)
    assert same["transfer"] == pytest.approx(1.0)
    scrambled = probe_transfer(codes, codes[:, [1, 2, 3, 0]], labels, train_fraction=0.5, seed=0)
    assert scrambled["source"] == pytest.approx(1.0)
    assert scrambled["transfer"] == pytest.approx(0.0)
    assert 0.2 < same["chance"] < 0.35


def test_sliced_wasserstein_of_a_shift_is_its_squared_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 3))
    shift = np.array([0.3, -0.4, 0.0])
    # E_theta (theta . t)^2 * d = ||t||^2 = 0.25; 4000 directions: within a few percent
    assert sliced_wasserstein_np(x, x + shift, 4000, seed=0) == pytest.approx(0.25, rel=0.05)
    assert sliced_wasserstein_np(x, x[::-1], 64, seed=0) == pytest.approx(0.0, abs=1e-12)


def _known_case():
    rng = np.random.default_rng(1)
    z = np.zeros((200, 3))
    z[np.arange(200), rng.integers(0, 3, 200)] = rng.uniform(0.5, 1.5, 200)
    maps = [rng.standard_normal((4, 3)), rng.standard_normal((5, 3))]
    return z, maps, [(z @ m.T).astype(np.float32) for m in maps]


def test_evaluate_alignment_of_a_perfect_model():
    z, maps, test = _known_case()
    result = evaluate_alignment(
        KnownModel(maps), test, labels=np.argmax(z, 1), concepts=z, **AT_SCHEMA_DEFAULTS
    )
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
    permuted = KnownModel(maps, permutation=[1, 2, 0])
    summary = evaluate_alignment(
        permuted, test, labels=np.argmax(z, 1), concepts=z, **AT_SCHEMA_DEFAULTS
    )["summary"]
    assert summary["explained_variance"] == pytest.approx(1.0, abs=1e-4)  # each SAE is perfect
    assert summary["mcc"] == pytest.approx(1.0, abs=1e-4)
    assert summary["jaccard"] == pytest.approx(0.0, abs=1e-6)  # one-hot codes on other latents
    assert summary["tr_r2"] < 0.0
    assert summary["probe_transfer"] < 0.5 < summary["probe_source"]


def test_weighted_code_correlation_discounts_rare_latents():
    a = np.zeros((100, 2))
    a[:, 0] = np.arange(100) % 7 + 1.0  # fires on every row, identical in both domains
    b = a.copy()
    a[0, 1], b[1, 1] = 1.0, 1.0  # fires once in each domain, on different rows: corr ~ -0.01
    rare = np.corrcoef(a[:, 1], b[:, 1])[0, 1]
    assert code_correlation(a, b, weighted=False) == pytest.approx((1 + rare) / 2)
    # weights: latent 0 fires on 100% of rows, latent 1 on 1%
    assert code_correlation(a, b) == pytest.approx((1.0 * 1 + 0.01 * rare) / 1.01)


def _rotate_sae(sae, q):
    """``sae`` for inputs ``x q``: the same codes and ``D' E' (x q) = (D E x) q``."""
    import copy

    import torch

    rotated = copy.deepcopy(sae)
    q = torch.as_tensor(q, dtype=torch.float32)
    with torch.no_grad():
        rotated.encoder.copy_(sae.encoder @ q)
        rotated.decoder.copy_(q.T @ sae.decoder)
        rotated.b_dec.copy_(sae.b_dec @ q)
    return rotated


def test_every_basis_free_metric_and_its_draws_are_unchanged_by_rotating_domain_b():
    """Two different random TopK SAEs on two different domains; domain b and its SAE in a random
    orthonormal basis give the same metrics, attribute fit and bootstrap draws (the sliced
    Wasserstein distances of b's inputs draw random directions, so only they may move)."""
    import torch

    from repdiag.alignment.methods import PairModel
    from repdiag.alignment.real_pairs import probe_truth, random_rotation
    from repdiag.alignment.topk import TopKSAE
    from repdiag.common.intervals import bootstrap_counts

    generator = torch.Generator().manual_seed(0)
    saes = [TopKSAE(d, 16, 3, dead_after=4096, generator=generator) for d in (6, 7)]
    rng = np.random.default_rng(0)
    labels = (rng.random((600, 2)) < 0.5).astype(np.float32)
    x_a = labels @ rng.standard_normal((2, 6)) + 0.4 * rng.standard_normal((600, 6))
    x_b = labels @ rng.standard_normal((2, 7)) + 0.4 * rng.standard_normal((600, 7))
    q = random_rotation(7, 2)
    counts = bootstrap_counts(200, 50, seed=0)
    results = []
    for b, sae_b in ((x_b, saes[1]), (x_b @ q, _rotate_sae(saes[1], q))):
        xs = [x_a.astype(np.float32), b.astype(np.float32)]
        fit, test = [x[:400] for x in xs], [x[400:] for x in xs]
        truth = probe_truth(fit, [labels[:400]] * 2, test, labels[400:], ["u", "v"], seed=0)
        assert len(truth.shared) == 2
        model = PairModel([saes[0], sae_b])
        task = labels[400:, 0].astype(int)
        results.append(
            evaluate_alignment(
                model, test, labels=task, truth=truth, bootstrap_counts=counts, **AT_SCHEMA_DEFAULTS
            )
        )
    plain, rotated = results
    moving = {"sw_translation", "sw_floor"}
    for key, value in plain["summary"].items():
        if key in moving or value is None:
            assert key in moving or rotated["summary"][key] is None, key
            continue
        assert rotated["summary"][key] == pytest.approx(value, abs=1e-5), key
    assert plain["summary"]["tr_intervention"] is not None
    for key, draws in plain["bootstrap_draws"].items():
        np.testing.assert_allclose(rotated["bootstrap_draws"][key], draws, atol=1e-5, err_msg=key)
