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
