"""Real-embedding pairs: pairing by image id, controls, attribute effects and probes fitted on the
training images, rotation-equivariant standardisation (repdiag.alignment.real_pairs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import xarray as xr

from repdiag.alignment.real_pairs import (
    PairSplit,
    embedding_pairs,
    global_scale,
    probe_truth,
    random_rotation,
    read_layer,
    standardise,
)
from repdiag.core.errors import StoreError
from repdiag.core.store import write_store


def _store(path, ids, values, image_sets):
    ds = xr.Dataset(
        {"emb_final": (("image", "dim_final"), values.astype(np.float32))},
        coords={"image": ids, "image_set": ("image", image_sets)},
    )
    write_store(path, ds)
    return path


def test_embedding_pairs_pair_rows_by_image_id(tmp_path):
    n = 200
    ids = np.array([f"query/q{i:05d}" for i in range(n)])
    number = np.arange(n, dtype=np.float64)
    values_a = np.stack([number, np.sin(number)], axis=1)
    # store b: other image order, three columns, and ten images store a does not have
    order = np.random.default_rng(0).permutation(n)
    extra = np.array([f"pair/p{i:05d}/m0" for i in range(10)])
    ids_b = np.concatenate([ids[order], extra])
    values_b = np.stack([2 * number[order], number[order] ** 0.5, -number[order]], axis=1)
    values_b = np.concatenate([values_b, np.full((10, 3), 1e3)])
    path_a = _store(tmp_path / "a.zarr", ids, values_a, ["query"] * n)
    path_b = _store(tmp_path / "b.zarr", ids_b, values_b, ["query"] * n + ["pair"] * 10)

    data = embedding_pairs(path_a, path_b, PairSplit("final", 0.1, 0.25, seed=0), n_clusters=3)
    test_a, test_b = data.test
    assert data.info["n_common_images"] == n
    np.testing.assert_allclose(test_b[:, 0], 2 * test_a[:, 0])
    train_a, train_b = data.train
    np.testing.assert_allclose(train_b[: data.n_paired, 0], 2 * train_a[: data.n_paired, 0])
    # unpaired training rows are disjoint images, split between the two domains
    unpaired_a = set(train_a[data.n_paired :, 0])
    unpaired_b = {v / 2 for v in train_b[data.n_paired :, 0]}
    assert not unpaired_a & unpaired_b
    assert len(unpaired_a) + len(unpaired_b) + data.n_paired + len(test_a) == n
    assert data.n_paired == 15  # 10% of the 150 training images
    assert set(np.unique(data.test_labels)) <= {0, 1, 2}


def test_random_rotation_is_orthogonal_seeded_and_not_the_identity():
    q = random_rotation(7, seed=0)
    np.testing.assert_allclose(q.T @ q, np.eye(7), atol=1e-12)
    np.testing.assert_array_equal(q, random_rotation(7, seed=0))
    assert not np.allclose(q, random_rotation(7, seed=1))
    assert np.abs(np.diag(q)).max() < 0.99


def test_rotation_control_is_store_a_in_a_random_basis(tmp_path):
    n = 120
    ids = np.array([f"query/q{i:05d}" for i in range(n)])
    values = np.random.default_rng(1).standard_normal((n, 5))
    path = _store(tmp_path / "a.zarr", ids, values, ["query"] * n)
    split = PairSplit("final", 0.5, 0.25, seed=3)
    plain = embedding_pairs(path, path, split, n_clusters=2)
    rotated = embedding_pairs(path, path, split, n_clusters=2, control="rotation")
    q = random_rotation(5, seed=3)
    test_a, test_b = rotated.test
    np.testing.assert_allclose(test_a, plain.test[0])
    np.testing.assert_allclose(test_b, test_a @ q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.linalg.norm(test_b, axis=1), np.linalg.norm(test_a, axis=1), rtol=1e-5
    )
    pairs_a, pairs_b = (x[: rotated.n_paired] for x in rotated.train)
    np.testing.assert_allclose(pairs_b, pairs_a @ q, rtol=1e-5, atol=1e-5)


def test_shuffle_control_breaks_the_training_pairs_only(tmp_path):
    n = 120
    ids = np.array([f"query/q{i:05d}" for i in range(n)])
    values = np.random.default_rng(1).standard_normal((n, 5))
    path = _store(tmp_path / "a.zarr", ids, values, ["query"] * n)
    split = PairSplit("final", 1.0, 0.25, seed=3)
    rotated = embedding_pairs(path, path, split, n_clusters=2, control="rotation")
    shuffled = embedding_pairs(path, path, split, n_clusters=2, control="shuffle")
    q = random_rotation(5, seed=3)
    # held-out pairs and training rows of a are those of the rotation control
    np.testing.assert_allclose(shuffled.test[0], rotated.test[0])
    np.testing.assert_allclose(shuffled.test[1], rotated.test[1])
    np.testing.assert_allclose(shuffled.train[0], rotated.train[0])
    # b's training rows are the same rows, permuted: the anchor pairs are wrong
    pairs_a, pairs_b = (x[: shuffled.n_paired] for x in shuffled.train)
    unrotated_b = pairs_b @ q.T
    matches = np.isclose(unrotated_b, pairs_a, atol=1e-4).all(axis=1)
    assert matches.mean() < 0.1
    np.testing.assert_allclose(
        np.sort(shuffled.train[1], axis=0), np.sort(rotated.train[1], axis=0), atol=1e-6
    )


def test_embedding_pairs_errors_name_the_store(tmp_path):
    ids = np.array([f"query/q{i:05d}" for i in range(20)])
    path_a = _store(tmp_path / "a.zarr", ids, np.zeros((20, 2)), ["query"] * 20)
    other = np.array([f"pair/p{i:05d}/m0" for i in range(20)])
    path_b = _store(tmp_path / "b.zarr", other, np.zeros((20, 2)), ["pair"] * 20)
    with pytest.raises(StoreError, match="share only 0 image ids"):
        embedding_pairs(path_a, path_b, PairSplit("final", 1.0, 0.25, seed=0), n_clusters=2)
    with pytest.raises(ValueError, match="unknown real-pair control 'rotate'"):
        embedding_pairs(
            path_a, path_a, PairSplit("final", 1.0, 0.25, seed=0), n_clusters=2, control="rotate"
        )
    with pytest.raises(StoreError, match="emb_block03"):
        read_layer(path_a, "block03")
    with pytest.raises(StoreError, match="does not exist"):
        read_layer(tmp_path / "missing.zarr", "final")


def _attribute_rows(n: int, seed: int, strength=(3.0, 0.4, 0.0), d: int = 6):
    """``n`` rows of ``d`` dims: three binary attributes, attribute ``a`` adding ``strength[a]``
    times a random unit direction, plus unit Gaussian noise."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, len(strength))) < 0.5).astype(np.float32)
    directions = rng.standard_normal((len(strength), d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    x = labels @ (np.asarray(strength)[:, None] * directions) + rng.standard_normal((n, d))
    return x.astype(np.float32), labels, directions


def test_probe_truth_effects_probes_and_split_half_stability_by_hand():
    rows, all_labels, directions = _attribute_rows(2400, 0, d=40)
    x, labels, test_x, test_labels = rows[:2000], all_labels[:2000], rows[2000:], all_labels[2000:]
    rare = np.zeros((2000, 1), dtype=np.float32)
    rare[:6] = 1  # fewer than MIN_CLASS_ROWS positives in one half: not scored
    fit_y = np.concatenate([labels, rare], axis=1)
    test_y = np.concatenate([test_labels, np.zeros((400, 1), dtype=np.float32)], axis=1)
    truth = probe_truth(
        (x, 2 * x),
        (fit_y, fit_y),
        (test_x, 2 * test_x),
        test_y,
        ["big", "weak", "none", "rare"],
        seed=0,
    )
    # effects: the difference of class means, the planted direction times its strength
    # (standard error about 0.045 per coordinate with 1000 rows per class)
    np.testing.assert_allclose(truth.effects[0][0], 3.0 * directions[0], atol=0.2)
    np.testing.assert_allclose(truth.effects[1][0], 2 * truth.effects[0][0], rtol=1e-5)
    assert truth.probes[0][0] @ directions[0] > 0
    # the bar (0.7) reads the accuracy cross-fitted on the fit rows: strong yes, weak and absent no
    assert truth.fit_accuracy[0][0] > 0.9 and truth.fit_accuracy[0][2] < 0.56
    assert 0.5 < truth.fit_accuracy[0][1] < 0.7
    assert list(truth.shared) == [0] and not truth.present[0][3]
    assert np.isnan(truth.fit_accuracy[0][3]) and np.isnan(truth.stability[0][3])
    # split-half stability: near 1 for a strong effect; for an attribute x does not carry, the
    # cosine of two noise vectors (mean 0, standard deviation 1 / sqrt(40))
    assert truth.stability[0][0] > 0.95 and abs(truth.stability[0][2]) < 0.5
    np.testing.assert_allclose(truth.stability[0], truth.stability[1], rtol=1e-6)
    # the held-out accuracy is reported, never used to select
    assert truth.probe_accuracy[0][0] > 0.9
    lower = probe_truth(
        (x, 2 * x),
        (fit_y, fit_y),
        (test_x, 2 * test_x),
        test_y,
        list("abcd"),
        min_accuracy=0.55,
        seed=0,
    )
    assert list(lower.shared) == [0, 1]
    # evaluation rows: every held-out row; the latents are matched on the fit rows
    assert list(truth.eval_rows) == list(range(400))
    fit_x, fit_concepts = truth.matching_set(0, test_x)
    np.testing.assert_array_equal(fit_x, x)
    np.testing.assert_array_equal(fit_concepts, fit_y)


def test_selection_and_fit_never_read_the_held_out_rows():
    rows, all_labels, _ = _attribute_rows(1300, 2)
    x, labels, test_x, test_labels = rows[:1000], all_labels[:1000], rows[1000:], all_labels[1000:]
    names = ["big", "weak", "none"]
    truth = probe_truth((x, x), (labels, labels), (test_x, test_x), test_labels, names, seed=0)
    scrambled = np.random.default_rng(0).permutation(test_labels)
    noise = np.random.default_rng(1).standard_normal(test_x.shape).astype(np.float32)
    other = probe_truth((x, x), (labels, labels), (noise, noise), scrambled, names, seed=0)
    for i in (0, 1):
        np.testing.assert_array_equal(other.present[i], truth.present[i])
        np.testing.assert_array_equal(other.effects[i], truth.effects[i])
        np.testing.assert_array_equal(other.probes[i], truth.probes[i])
        np.testing.assert_array_equal(other.fit_accuracy[i], truth.fit_accuracy[i])
    assert other.probe_accuracy[0][0] < 0.6 < truth.probe_accuracy[0][0]  # only the report moves


def test_standardisation_and_probes_are_equivariant_under_a_rotation():
    rows, all_labels, _ = _attribute_rows(1500, 4, strength=(2.0, 0.8, 0.0))
    x, labels, test_x, test_labels = rows[:1200], all_labels[:1200], rows[1200:], all_labels[1200:]
    x = x * np.array([1, 5, 0.2, 1, 3, 1], dtype=np.float32)  # unequal coordinate scales
    q = random_rotation(6, 7)
    rotated = (x @ q).astype(np.float32)
    assert global_scale(rotated) == pytest.approx(global_scale(x), rel=1e-6)
    np.testing.assert_allclose(standardise(rotated), standardise(x) @ q, atol=1e-5)
    truth = probe_truth(
        (x, rotated), (labels, labels), (test_x, test_x @ q), test_labels, list("abc"), seed=0
    )
    np.testing.assert_array_equal(truth.present[0], truth.present[1])
    np.testing.assert_allclose(truth.fit_accuracy[1], truth.fit_accuracy[0], atol=1e-6)
    np.testing.assert_allclose(truth.stability[1], truth.stability[0], atol=1e-5)
    np.testing.assert_allclose(truth.effects[1], truth.effects[0] @ q, atol=1e-4)
    scale = np.abs(truth.probes[0]).max()
    np.testing.assert_allclose(truth.probes[1], truth.probes[0] @ q, atol=1e-4 * scale)
    # a per-coordinate z-score is not equivariant: on these inputs its probes would differ
    z = (x - x.mean(0)) / x.std(0)
    z_rotated = (rotated - rotated.mean(0)) / rotated.std(0)
    assert not np.allclose(z_rotated, z @ q, atol=1e-2)


def _attribute_store(tmp_path, n=160, d=5, seed=0):
    """A store of ``n`` images whose embeddings carry two of three attributes, and the
    attributes ``(ids, names, indicators)`` as :func:`repdiag.binding.dataset.slot_attributes`."""
    ids = np.array([f"query/q{i:05d}" for i in range(n)])
    x, labels, _ = _attribute_rows(n, seed, strength=(3.0, 2.0, 0.0), d=d)
    path = _store(tmp_path / f"s{seed}.zarr", ids, x, ["query"] * n)
    return path, ids, x, (ids, ["u", "v", "w"], labels)


def test_attributes_are_fitted_on_the_training_images_of_the_seeds_split(tmp_path):
    path, ids, x, attributes = _attribute_store(tmp_path)
    split = PairSplit("final", 0.5, 0.25, seed=3)
    data = embedding_pairs(path, path, split, n_clusters=2, attributes=attributes)
    truth, info = data.truth, data.info
    assert info["n_test"] == 40 and info["n_fit"] == 120 and info["seed"] == 3
    # the fit rows are the 120 training images, disjoint from the 40 held-out ones
    fit_ids = {ids[np.flatnonzero((x == row).all(axis=1))[0]] for row in truth.fit_inputs[0]}
    test_ids = {ids[np.flatnonzero((x == row).all(axis=1))[0]] for row in data.test[0]}
    assert len(fit_ids) == 120 and len(test_ids) == 40 and not fit_ids & test_ids
    assert list(truth.shared) == [0, 1] and info["decodable_accuracy"] == 0.7
    assert set(info["attributes"]["u"]) == {
        "scored",
        "fit_accuracy",
        "probe_accuracy",
        "effect_stability",
    }
    assert info["attributes"]["u"]["scored"] and not info["attributes"]["w"]["scored"]
    # the held-out rows' embeddings do not enter the fit: rewriting them changes no effect
    changed = x.copy()
    held_out = np.isin(ids, sorted(test_ids))
    changed[held_out] = 100.0 * np.random.default_rng(9).standard_normal((40, 5))
    other = _store(tmp_path / "changed.zarr", ids, changed, ["query"] * len(ids))
    redone = embedding_pairs(other, other, split, n_clusters=2, attributes=attributes).truth
    np.testing.assert_array_equal(redone.effects[0], truth.effects[0])
    np.testing.assert_array_equal(redone.present[0], truth.present[0])
    # another seed draws another split
    again = embedding_pairs(path, path, replace(split, seed=4), n_clusters=2, attributes=attributes)
    assert again.info["test_ids_head"] != info["test_ids_head"]


def test_a_rotation_of_b_leaves_the_probe_task_and_the_scored_attributes_unchanged(tmp_path):
    path, _, _, attributes = _attribute_store(tmp_path, n=200, seed=1)
    split = PairSplit("final", 1.0, 0.3, seed=2)
    plain = embedding_pairs(path, path, split, n_clusters=3, attributes=attributes)
    rotated = embedding_pairs(
        path, path, split, n_clusters=3, attributes=attributes, control="rotation"
    )
    np.testing.assert_array_equal(rotated.test_labels, plain.test_labels)
    np.testing.assert_array_equal(rotated.truth.present[1], plain.truth.present[1])
    np.testing.assert_allclose(
        rotated.truth.fit_accuracy[1], plain.truth.fit_accuracy[1], atol=1e-6
    )
