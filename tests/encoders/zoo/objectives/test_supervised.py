"""The supervised loss against numpy and slot labels mirrored with the image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.binding.scenes import scene_batch
from repdiag.encoders.zoo.objectives.supervised import mirror_slots, supervised_loss
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
    objective, _ = build_objective({**spec, "hparams": {**spec["hparams"], "label": "slot_shape"}})
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
