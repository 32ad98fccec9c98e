"""DINO: the loss against the pair loop, the centre and momentum schedule, the EMA teacher."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.objectives.dino import dino_loss, teacher_momentum, update_center
from repdiag.encoders.zoo.train import build_objective
from tests.encoders.zoo.objectives.reference import fixed, log_softmax, t


def test_dino_matches_the_pair_loop():
    k, b = 7, 4
    student = [fixed(b, k, seed=10 + i) for i in range(4)]  # 2 global + 2 local crops
    teacher = [fixed(b, k, seed=20 + i) for i in range(2)]
    center = 0.1 * fixed(1, k, seed=30)
    ts, tt = 0.1, 0.04
    total, terms = 0.0, 0
    for i, g in enumerate(teacher):
        for j, s in enumerate(student):
            if i == j:
                continue
            for row in range(b):
                p = np.exp(log_softmax((g[row] - center[0]) / tt))
                total += -(p * log_softmax(s[row] / ts)).sum() / b
            terms += 1
    got = dino_loss([t(s) for s in student], [t(g) for g in teacher], t(center), ts, tt).item()
    assert terms == 6
    assert got == pytest.approx(total / terms, rel=1e-10)


def test_dino_center_and_momentum_schedule():
    teacher = [t(np.array([[1.0, 3.0]])), t(np.array([[3.0, 5.0]]))]
    center = update_center(t(np.array([[10.0, 10.0]])), teacher, 0.9)
    assert center.numpy() == pytest.approx(np.array([[9.2, 9.4]]))  # 0.9 * 10 + 0.1 * mean
    assert teacher_momentum(0, 11, 0.99) == pytest.approx(0.99)
    assert teacher_momentum(5, 11, 0.99) == pytest.approx(0.995)
    assert teacher_momentum(10, 11, 0.99) == pytest.approx(1.0)


def test_dino_exports_the_teacher_and_updates_it_by_ema(tiny_spec):
    objective, _ = build_objective(tiny_spec("dino"), "cpu")
    backbone, head = objective.export()
    assert backbone is objective.teacher_backbone and head is objective.teacher_head.mlp
    before = [p.clone() for p in objective.teacher_backbone.parameters()]
    with torch.no_grad():
        for p in objective.backbone.parameters():
            p.add_(1.0)
    objective.after_step(0, 11)  # momentum 0.99 at step 0
    for old, new, student in zip(
        before,
        objective.teacher_backbone.parameters(),
        objective.backbone.parameters(),
        strict=True,
    ):
        assert torch.allclose(new, 0.99 * old + 0.01 * student)


def test_dino_freezes_the_prototypes_at_first(tiny_spec):
    objective, _ = build_objective(tiny_spec("dino"), "cpu")
    objective.head.prototypes.grad = torch.ones_like(objective.head.prototypes)
    objective.before_update(0, 100)  # freeze_prototypes_fraction 0.1: steps 0..9
    assert objective.head.prototypes.grad is None
    objective.head.prototypes.grad = torch.ones_like(objective.head.prototypes)
    objective.before_update(10, 100)
    assert objective.head.prototypes.grad is not None
