"""The supervised loss against numpy and slot labels mirrored with the image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.objectives.supervised import mirror_slots, supervised_loss
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import build_objective, to_batch
from tests.encoders.zoo.objectives.reference import fixed, log_softmax, t


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_supervised_loss_matches_numpy(smoothing):
    logits = fixed(3, 4, 5, seed=50)  # batch 3, 4 slots, 5 classes
    labels = np.array([[0, 1, 4, 2], [3, 3, 0, 1], [2, 0, 0, 4]])
    total = 0.0
    for b in range(3):
        for s in range(4):
            q = np.full(5, smoothing / 5)
            q[labels[b, s]] += 1 - smoothing
            total += -(q * log_softmax(logits[b, s])).sum()
    got = supervised_loss(t(logits), torch.tensor(labels), smoothing).item()
    assert got == pytest.approx(total / 12, rel=1e-10)


def test_supervised_mirrors_slot_labels_with_the_image(tiny_spec):
    assert mirror_slots((2, 3)).tolist() == [2, 1, 0, 5, 4, 3]
    spec = tiny_spec("supervised")
    objective, _ = build_objective(
        {**spec, "hparams": {**spec["hparams"], "label": "slot_shape"}}, "cpu"
    )
    scenes = scene_batch(objective.scenes, 0, 3, 16)
    batch = to_batch(scenes, "cpu")
    x, flipped = objective.view.apply(batch.images, torch.Generator().manual_seed(1))
    targets = objective.targets(batch.slot_shape, flipped)
    assert flipped.any() and (~flipped).any()
    # a slot is occupied in the augmented image iff its (mirrored) label says so; the tiny
    # config's background levels are <= 48/255 and jitter preserves the cell of every object
    grey = x.mean(dim=1)
    for b in range(16):
        for slot in range(4):
            r, c = divmod(slot, 2)
            cell = grey[b, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16]
            occupied = bool((cell - cell.amin()).amax() > 0.05)
            assert occupied == bool(targets[b, slot] > 0), (b, slot)


def with_dose(spec: dict, slot_weight: float) -> dict:
    return {**spec, "hparams": {**spec["hparams"], "slot_weight": slot_weight}}


def test_dose_zero_is_the_presence_objective_exactly(tiny_spec):
    spec = tiny_spec("supervised", steps=3)
    plain, _ = build_objective(spec, "cpu")
    dosed, _ = build_objective(with_dose(spec, 0.0), "cpu")
    assert dosed.slot_classifier is None
    assert plain.state_dict().keys() == dosed.state_dict().keys()
    for name, value in plain.state_dict().items():
        assert torch.equal(value, dosed.state_dict()[name]), name
    batch = to_batch(scene_batch(plain.scenes, 0, 0, 8), "cpu")
    a = plain.loss(batch, torch.Generator().manual_seed(3))
    b = dosed.loss(batch, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert plain.trivial_loss(batch) == dosed.trivial_loss(batch)


def test_dose_adds_lambda_times_the_slot_cross_entropy(tiny_spec):
    spec = tiny_spec("supervised", steps=3)
    plain, _ = build_objective(spec, "cpu")
    dosed, _ = build_objective(with_dose(spec, 0.3), "cpu")
    # the backbone and presence head start where the presence run starts (head built after)
    for name, value in plain.state_dict().items():
        assert torch.equal(value, dosed.state_dict()[name]), name
    batch = to_batch(scene_batch(plain.scenes, 0, 0, 8), "cpu")
    gen = torch.Generator().manual_seed(3)
    got = dosed.loss(batch, gen)
    # the same view, recomputed by hand
    x, flipped = dosed.view.apply(batch.images, torch.Generator().manual_seed(3))
    features = dosed.backbone(dosed.normalize(x))
    n_shapes = len(dosed.scenes.shapes)
    presence_logits = dosed.classifier(features).view(-1, n_shapes, 2)
    slot_logits = dosed.slot_classifier(features).view(-1, dosed.scenes.n_slots, n_shapes + 1)
    slots = torch.where(flipped.view(-1, 1), batch.slot_shape[:, dosed.mirror], batch.slot_shape)
    expected = supervised_loss(
        presence_logits, dosed.targets(batch.slot_shape, flipped), 0.0
    ) + 0.3 * supervised_loss(slot_logits, slots, 0.0)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    # trivial: entropy of the presence priors plus lambda x that of the slot priors
    slot_prior = np.stack(
        [np.bincount(col, minlength=n_shapes + 1) / 8 for col in batch.slot_shape.T.numpy()]
    )
    slot_entropy = -np.mean([sum(p * np.log(p) for p in row if p > 0) for row in slot_prior])
    assert dosed.trivial_loss(batch) == pytest.approx(
        plain.trivial_loss(batch) + 0.3 * slot_entropy, rel=1e-9
    )


def test_a_dose_needs_presence_labels(tiny_spec):
    spec = tiny_spec("supervised")
    slot_spec = {**spec, "hparams": {**spec["hparams"], "label": "slot_shape", "slot_weight": 1.0}}
    with pytest.raises(ValueError, match=r"slot_weight.*shape_presence"):
        build_objective(slot_spec, "cpu")
