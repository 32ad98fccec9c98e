"""The CLIP loss against a loop over the symmetric cross-entropy (Radford et al. 2021)."""

from __future__ import annotations

import numpy as np
import pytest

from repdiag.encoders.zoo.objectives.clip import clip_loss
from tests.encoders.zoo.objectives.reference import fixed, log_softmax, t


def test_clip_matches_the_symmetric_cross_entropy_loop():
    image, text, scale = fixed(5, 4, seed=8), fixed(5, 4, seed=9), 7.0
    a = image / np.linalg.norm(image, axis=1, keepdims=True)
    b = text / np.linalg.norm(text, axis=1, keepdims=True)
    logits = scale * a @ b.T
    i2t = -np.mean([log_softmax(logits[i])[i] for i in range(5)])
    t2i = -np.mean([log_softmax(logits[:, i])[i] for i in range(5)])
    assert clip_loss(t(image), t(text), scale).item() == pytest.approx((i2t + t2i) / 2, rel=1e-10)


def test_bag_captions_from_the_host_labels_are_those_of_the_device_labels(tiny_spec):
    """The step builds bag captions from the batch's host copy of its labels (no device sync);
    they are the captions the labels on the device give."""
    from dataclasses import replace

    from repdiag.encoders.zoo.scenes import scene_batch
    from repdiag.encoders.zoo.train import build_objective, to_batch

    objective, _ = build_objective(tiny_spec("clip"), "cpu")
    batch = to_batch(scene_batch(objective.scenes, 1, 3, 8), "cpu")
    assert batch.host_labels is not None
    without = replace(batch, host_labels=None)
    assert objective.caption_texts(batch) == objective.caption_texts(without)
