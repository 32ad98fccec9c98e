"""Alignment methods: registry, loss terms, SAE-A matching, crosscoder code (repdiag.alignment.methods)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.alignment.methods import (
    METHODS,
    Batch,
    CoSAE,
    CrosscoderModel,
    SAESettings,
    hungarian_match,
    make_method,
    squared_error,
    support_consistency,
)
from repdiag.alignment.topk import topk_relu
from repdiag.core.errors import ConfigError, RegistryError

torch.set_num_threads(1)
SAE = SAESettings.from_config(dict(n_latents=6, k=2, aux_k=2, aux_coef=1 / 32, dead_after=1000))


def _batch(with_pairs=True):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(32, 4, generator=gen), torch.randn(32, 5, generator=gen))
    pairs = (torch.randn(8, 4, generator=gen), torch.randn(8, 5, generator=gen))
    return Batch(x=x, pairs=pairs if with_pairs else None)


def _build(method):
    return method.build([4, 5], torch.Generator().manual_seed(0))


def test_registry_holds_the_five_methods():
    assert METHODS.names() == ["cosae", "crosscoder", "independent", "sae_a", "usae"]
    with pytest.raises(RegistryError, match="unknown alignment method"):
        make_method("dictionary", SAE)
    with pytest.raises(ConfigError, match="no loss ablations"):
        make_method("usae", SAE, ablation="all")
    with pytest.raises(ConfigError, match="unknown CoSAE ablation"):
        make_method("cosae", SAE, ablation="cycle")


@pytest.mark.parametrize(
    ("ablation", "terms", "uses_pairs"),
    [
        ("translation", {"reconstruction", "translation"}, True),
        ("consistency", {"reconstruction", "consistency"}, True),
        ("distributional", {"reconstruction", "dist_translation", "dist_consistency"}, False),
        (
            "all",
            {
                "reconstruction",
                "translation",
                "consistency",
                "dist_translation",
                "dist_consistency",
            },
            True,
        ),
    ],
)
def test_cosae_ablations_select_their_terms(ablation, terms, uses_pairs):
    weights = {"translation": 2.0, "dist_translation": 0.3}
    method = make_method("cosae", SAE, ablation=ablation, weights=weights, sw_projections=4)
    assert isinstance(method, CoSAE) and method.uses_pairs is uses_pairs
    got = method.loss_terms(_build(method), _batch(uses_pairs), torch.Generator().manual_seed(0))
    assert set(got) == terms | {"auxk"}
    assert all(torch.isfinite(v) for v in got.values())
    assert method.weight("consistency") == (1.0 if "consistency" in terms else 0.0)
    assert method.weight("translation") == (2.0 if "translation" in terms else 0.0)
    assert method.weight("auxk") == pytest.approx(1 / 32)


def test_cosae_translation_term_is_the_cross_decoding_error():
    method = make_method("cosae", SAE, ablation="translation")
    model, batch = _build(method), _batch()
    terms = method.loss_terms(model, batch, torch.Generator())
    xa, xb = batch.pairs
    expected = squared_error(model.decode(1, model.encode(0, xa)), xb) + squared_error(
        model.decode(0, model.encode(1, xb)), xa
    )
    torch.testing.assert_close(terms["translation"], expected)
    rec = squared_error(model.saes[0](batch.x[0])[0], batch.x[0]) + squared_error(
        model.saes[1](batch.x[1])[0], batch.x[1]
    )
    torch.testing.assert_close(terms["reconstruction"], rec)


def test_support_consistency_equals_code_distance_on_a_shared_support():
    method = make_method("cosae", SAE, ablation="consistency")
    model = _build(method)
    with torch.no_grad():  # both encoders put all their mass on latents 0 and 1
        for sae in model.saes:
            sae.encoder.zero_()
            sae.b_enc.copy_(torch.tensor([2.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
        model.saes[1].b_enc[0] = 3.0
    pairs = _batch().pairs
    codes = [model.encode(i, x) for i, x in enumerate(pairs)]
    value = support_consistency(model, pairs, codes)
    torch.testing.assert_close(value, squared_error(codes[0], codes[1]))
    assert value.item() == pytest.approx(1.0)  # (2 - 3)^2 on latent 0


def test_support_consistency_gives_a_gradient_to_a_latent_active_in_one_domain_only():
    method = make_method("cosae", SAE, ablation="consistency")
    model = _build(method)
    with torch.no_grad():
        for sae in model.saes:
            sae.encoder.zero_()
        model.saes[0].b_enc.copy_(torch.tensor([2.0, 1.0, 0.5, 0.0, 0.0, 0.0]))  # support {0, 1}
        model.saes[1].b_enc.copy_(torch.tensor([2.0, 0.5, 1.0, 0.0, 0.0, 0.0]))  # support {0, 2}
    pairs = _batch().pairs
    codes = [model.encode(i, x) for i, x in enumerate(pairs)]
    support_consistency(model, pairs, codes).backward()
    # latent 1 is cut by TopK in domain b, yet its pre-activation is pulled up towards a's code
    assert model.saes[1].b_enc.grad[1] < 0
    assert model.saes[0].b_enc.grad[2] < 0
    assert model.saes[1].b_enc.grad[3] == 0  # outside both supports: untouched


def test_hungarian_match_recovers_a_known_permutation():
    rng = np.random.default_rng(0)
    codes_a = rng.random((100, 5)) * (rng.random((100, 5)) < 0.4)
    permutation = np.array([2, 4, 0, 1, 3])
    codes_b = np.empty_like(codes_a)
    codes_b[:, permutation] = codes_a  # latent l of a is latent permutation[l] of b
    order, matched = hungarian_match(codes_a, codes_b)
    np.testing.assert_array_equal(order, permutation)
    np.testing.assert_allclose(codes_b[:, order], codes_a)
    assert matched == pytest.approx(1.0)


def test_sae_a_aligns_domain_b_onto_domain_a():
    method = make_method("sae_a", SAE)
    model = _build(method)
    gen = torch.Generator().manual_seed(4)
    xa = torch.randn(200, 4, generator=gen)
    with torch.no_grad():  # domain b: a copy of a's SAE (padded input) with shuffled latents
        model.saes[1].encoder.zero_()
        model.saes[1].encoder[:, :4].copy_(model.saes[0].encoder)
        model.saes[1].b_enc.copy_(model.saes[0].b_enc)
        model.saes[1].b_dec.zero_()
        model.saes[0].b_dec.zero_()
        model.saes[1].permute_latents(np.array([5, 3, 1, 0, 2, 4]))
    xb = torch.cat([xa, torch.zeros(200, 1)], dim=1)
    info = method.finalise(model, (xa, xb))
    torch.testing.assert_close(model.encode(1, xb), model.encode(0, xa))
    assert info["matched_correlation"] == pytest.approx(1.0, abs=1e-5)


def test_crosscoder_code_comes_from_summed_encoders():
    method = make_method("crosscoder", SAE)
    model = _build(method)
    assert isinstance(model, CrosscoderModel)
    batch = _batch()
    xa, xb = batch.pairs
    pre = model.saes[0].project(xa) + model.saes[1].project(xb) + model.b_enc
    torch.testing.assert_close(model.encode_joint(batch.pairs), topk_relu(pre, SAE.k))
    # standalone code: one encoder and the shared bias
    torch.testing.assert_close(
        model.encode(0, xa), topk_relu(model.saes[0].project(xa) + model.b_enc, SAE.k)
    )
    terms = method.loss_terms(model, batch, torch.Generator())
    z = model.encode_joint(batch.pairs)
    expected = squared_error(model.decode(0, z), xa) + squared_error(model.decode(1, z), xb)
    torch.testing.assert_close(terms["reconstruction"], expected)
    assert not any(sae.b_enc.requires_grad for sae in model.saes)


def test_usae_reconstructs_every_domain_from_one_code():
    method = make_method("usae", SAE)
    model, batch = _build(method), _batch()
    gen = torch.Generator().manual_seed(7)
    source = int(torch.randint(2, (1,), generator=torch.Generator().manual_seed(7)))
    terms = method.loss_terms(model, batch, gen)
    z = model.encode(source, batch.pairs[source])
    expected = sum(squared_error(model.decode(j, z), x) for j, x in enumerate(batch.pairs))
    torch.testing.assert_close(terms["reconstruction"], expected)


def test_every_method_gets_the_same_sample_budget():
    from repdiag.alignment.train import SAETrainSettings, batch_sizes

    settings = SAETrainSettings.from_config(dict(batch_size=256, pair_batch_size=128))

    def method(variant):
        name, _, ablation = variant.partition("-")
        return make_method(name, SAE, ablation=ablation or None)

    budgets = {
        variant: batch_sizes(method(variant), settings)
        for variant in (
            "independent",
            "sae_a",
            "crosscoder",
            "usae",
            "cosae-translation",
            "cosae-distributional",
            "cosae-all",
        )
    }
    assert {sum(b) for b in budgets.values()} == {384}
    assert budgets["crosscoder"] == budgets["usae"] == (0, 384)  # pairs only
    assert budgets["independent"] == budgets["sae_a"] == budgets["cosae-distributional"] == (384, 0)
    assert budgets["cosae-all"] == budgets["cosae-translation"] == (256, 128)


def test_usae_steps_only_the_sampled_model():
    from repdiag.alignment.concepts import SyntheticConcepts, synthetic_pairs
    from repdiag.alignment.train import SAETrainSettings, normalise, train_method

    data, _ = normalise(
        synthetic_pairs(
            SyntheticConcepts.from_config(
                dict(
                    n_concepts=4,
                    k_active=1,
                    dims=(6, 5),
                    maps=("linear", "linear"),
                    nonlinearity=0.0,
                    noise=0.0,
                    n_train=256,
                    n_test=32,
                )
            ),
            paired_fraction=1.0,
            seed=0,
        )
    )
    settings = SAETrainSettings.from_config(
        dict(steps=1, batch_size=16, pair_batch_size=16, decay_fraction=0.0)
    )
    sae = SAESettings.from_config(dict(n_latents=8, k=2, aux_k=0, aux_coef=0.0, dead_after=100))
    method = make_method("usae", sae)
    before = method.build([6, 5], torch.Generator().manual_seed(3))
    after = train_method(method, data, settings, seed=3).model
    source = method.active_model
    other = 1 - source
    # same initialisation: train_method builds from the same seeded generator
    for name in ("encoder", "decoder", "b_enc"):
        assert not torch.equal(
            getattr(after.saes[source], name), getattr(before.saes[source], name)
        )
        torch.testing.assert_close(
            getattr(after.saes[other], name), getattr(before.saes[other], name)
        )
