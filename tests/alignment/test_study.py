"""One alignment job end to end: CoSAE recovers the concepts with full pairing, distributional
training matches laws not instances, runs are seeded (repdiag.alignment.study)."""

from __future__ import annotations

import pytest
import torch

from repdiag.alignment.concepts import SyntheticConcepts, synthetic_pairs
from repdiag.alignment.grid import variant_terms
from repdiag.alignment.methods import SAESettings, make_method
from repdiag.alignment.study import fit_and_evaluate
from repdiag.alignment.train import SAETrainSettings, normalise, train_method
from tests.alignment.known import AT_SCHEMA_DEFAULTS
from tests.alignment.tiny import DATA, EVALUATION, SAE, TRAIN

torch.set_num_threads(1)


WEIGHTS = dict(
    reconstruction=1.0, translation=1.0, consistency=1.0, dist_translation=0.3, dist_consistency=0.3
)


def _run(variant: str, fraction: float, seed: int = 0) -> dict:
    data, _ = normalise(
        synthetic_pairs(
            SyntheticConcepts.from_config(dict(**DATA)), paired_fraction=fraction, seed=seed
        )
    )
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
    data, _ = normalise(
        synthetic_pairs(
            SyntheticConcepts.from_config(dict(**{**DATA, "n_train": 512})),
            paired_fraction=0.5,
            seed=1,
        )
    )
    settings = SAETrainSettings.from_config(dict(steps=15, batch_size=32, pair_batch_size=16))
    sae = SAESettings.from_config(dict(**SAE))
    runs = [
        train_method(make_method("cosae", sae, sw_projections=4), data, settings, seed=3)
        for _ in range(2)
    ]
    for p, q in zip(runs[0].model.parameters(), runs[1].model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert runs[0].curve[-1]["step"] == 15


def test_the_exact_translator_is_a_in_bs_basis_and_scores_the_ceiling():
    import numpy as np
    import torch

    from repdiag.alignment.methods import PairModel
    from repdiag.alignment.metrics import evaluate_alignment
    from repdiag.alignment.real_pairs import probe_truth, random_rotation
    from repdiag.alignment.study import exact_translator
    from repdiag.alignment.topk import TopKSAE

    generator = torch.Generator().manual_seed(0)
    sae = TopKSAE(6, 12, 3, dead_after=4096, generator=generator)
    with torch.no_grad():
        sae.b_dec.copy_(torch.randn(6, generator=generator) * 0.1)
    model = PairModel([sae, TopKSAE(6, 12, 3, dead_after=4096, generator=generator)])
    q = random_rotation(6, 4)
    rng = np.random.default_rng(0)
    labels = (rng.random((300, 2)) < 0.5).astype(np.float32)
    x_a = (labels @ rng.standard_normal((2, 6)) + 0.3 * rng.standard_normal((300, 6))).astype(
        np.float32
    )
    x_b = (x_a @ q).astype(np.float32)
    exact = exact_translator(model, q)
    with torch.no_grad():
        translated = exact.translate(0, 1, torch.as_tensor(x_a)).numpy()
        own = exact.decode(0, exact.encode(0, torch.as_tensor(x_a))).numpy()
        np.testing.assert_allclose(translated, own @ q, atol=1e-5)
        np.testing.assert_array_equal(
            exact.encode(1, torch.as_tensor(x_b)).numpy() > 0,
            exact.encode(0, torch.as_tensor(x_a)).numpy() > 0,
        )
    assert model.saes[1] is not exact.saes[1]  # the trained model is left as it was
    fit, test = (x_a[:200], x_b[:200]), (x_a[200:], x_b[200:])
    truth = probe_truth(fit, (labels[:200], labels[:200]), test, labels[200:], ["u", "v"], seed=0)
    summary = evaluate_alignment(
        exact, test, labels=np.zeros(100, int), truth=truth, **AT_SCHEMA_DEFAULTS
    )["summary"]
    assert summary["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["cont_intervention"] == pytest.approx(1.0, abs=1e-4)
    assert summary["jaccard"] == pytest.approx(1.0)


def _real_params(control: str) -> dict:
    return {
        "pair": {"a": "m", "b": "m", "layer": "final", "control": control},
        "image_sets": [],
        "max_images": 8192,
        "test_fraction": 0.25,
        "paired_fractions": [1.0],
        "variants": ["independent", "cosae-all"],
        "n_clusters": 3,
        "seeds": [0, 1],
        "bootstrap": {"resamples": 100, "confidence": 0.9},
        "decodable_accuracy": 0.7,
        "sae": {"n_latents": 8, "k": 2, "aux_k": 2, "aux_coef": 1 / 32, "dead_after": 512},
        "train": {"steps": 4, "batch_size": 16, "pair_batch_size": 8, "sw_projections": 4},
        "weights": {"independent": None, "cosae-all": WEIGHTS},
        "evaluation": {"sw_projections": 8, "probe_train_fraction": 0.5},
    }


def test_a_real_pair_runs_every_seed_with_intervals_and_the_exact_ceiling(tmp_path):
    import json

    import numpy as np
    import xarray as xr

    from repdiag.alignment import study
    from repdiag.alignment.bootstrap import INTERVAL_METRICS
    from repdiag.alignment.report import claims_table, results_table, summary_table
    from repdiag.core.store import write_store

    rng = np.random.default_rng(0)
    ids = np.array([f"query/q{i:05d}" for i in range(160)])
    labels = (rng.random((160, 2)) < 0.5).astype(np.float32)
    x = labels @ (3 * rng.standard_normal((2, 5))) + rng.standard_normal((160, 5))
    ds = xr.Dataset(
        {"emb_final": (("image", "dim_final"), x.astype(np.float32))},
        coords={"image": ids, "image_set": ("image", ["query"] * 160)},
    )
    write_store(tmp_path / "m.zarr", ds)
    store = tmp_path / "m.zarr"
    job = study.run_real(
        _real_params("rotation"), store, store, attributes=(ids, ["u", "v"], labels)
    )
    json.dumps(job)  # no numpy draws are left in the record
    runs = job["runs"]
    assert [(r["seed"], r["variant"]) for r in runs] == [
        (seed, v) for seed in (0, 1) for v in ("independent", "cosae-all", "exact-translator")
    ]
    assert [info["seed"] for info in job["data_info"]] == [0, 1]
    assert job["data_info"][0]["test_ids_head"] != job["data_info"][1]["test_ids_head"]
    for run in runs:
        assert set(run["intervals"]) == set(INTERVAL_METRICS)
        low, high = run["intervals"]["tr_r2"]
        assert low <= high
        if run["variant"] == "exact-translator":  # the ceiling, at every seed
            assert run["summary"]["tr_intervention"] == pytest.approx(1.0, abs=1e-4)
            assert run["intervals"]["tr_intervention"] == pytest.approx([1.0, 1.0], abs=1e-4)
    groups = {(g["variant"], g["paired_fraction"]): g for g in job["seed_intervals"]}
    assert set(groups) == {("independent", 0.0), ("cosae-all", 1.0), ("exact-translator", 1.0)}
    assert all(g["n_seeds"] == 2 for g in groups.values())
    table = results_table([], [job])
    assert len(table) == 6 and {"tr_r2_ci_low", "tr_r2_ci_high"} <= set(table.columns)
    summary = summary_table(table, [job]).set_index("variant")
    assert summary.loc["cosae-all", "n_seeds"] == 2
    assert summary.loc["cosae-all", "tr_intervention_exact"] == pytest.approx(1.0, abs=1e-4)
    assert summary.loc["cosae-all", "tr_r2_min"] <= summary.loc["cosae-all", "tr_r2_max"]
    assert np.isfinite(summary.loc["cosae-all", "tr_r2_ci_low"])
    assert claims_table(table).empty  # a control pair has no claims
