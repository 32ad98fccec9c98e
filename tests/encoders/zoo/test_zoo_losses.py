"""Each zoo loss against an independent loop/numpy implementation of its paper's formula, plus
closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.objectives.barlow_twins import barlow_twins_loss
from repdiag.encoders.zoo.objectives.clip import clip_loss
from repdiag.encoders.zoo.objectives.dino import dino_loss, teacher_momentum, update_center
from repdiag.encoders.zoo.objectives.mae import mae_loss, patchify
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss
from repdiag.encoders.zoo.objectives.supervised import supervised_loss
from repdiag.encoders.zoo.objectives.vicreg import vicreg_loss


def fixed(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def log_softmax(row: np.ndarray) -> np.ndarray:
    m = row.max()
    return row - m - math.log(sum(math.exp(v - m) for v in row))


# --- Barlow Twins -----------------------------------------------------------------------------


def barlow_reference(z1: np.ndarray, z2: np.ndarray, lam: float) -> float:
    n, d = z1.shape
    a = (z1 - z1.mean(0)) / np.sqrt(z1.var(0) + 1e-5)
    b = (z2 - z2.mean(0)) / np.sqrt(z2.var(0) + 1e-5)
    total = 0.0
    for i in range(d):
        for j in range(d):
            c_ij = sum(a[k, i] * b[k, j] for k in range(n)) / n
            total += (1 - c_ij) ** 2 if i == j else lam * c_ij**2
    return total


def test_barlow_twins_matches_the_double_sum():
    z1, z2 = fixed(10, 6, seed=1), fixed(10, 6, seed=2)
    expected = barlow_reference(z1, z2, 0.0051)
    assert barlow_twins_loss(t(z1), t(z2), 0.0051).item() == pytest.approx(expected, rel=1e-10)


def test_barlow_twins_is_zero_for_identical_decorrelated_views():
    # 7 orthonormal columns orthogonal to the ones vector (eigenvectors of the centring matrix),
    # scaled to biased variance 1: C = I / (1 + 1e-5), so L = 7 (1 - 1 / (1 + 1e-5))^2 ~ 7e-10
    u, _, _ = np.linalg.svd(np.eye(8) - 1 / 8)
    z = u[:, :7] * np.sqrt(8)
    assert np.allclose(z.mean(0), 0) and np.allclose(z.var(0), 1)
    expected = 7 * (1 - 1 / (1 + 1e-5)) ** 2
    assert barlow_twins_loss(t(z), t(z), 1.0).item() == pytest.approx(expected, rel=1e-6)


# --- VICReg -----------------------------------------------------------------------------------


def vicreg_reference(z1, z2, lam, mu, nu, gamma):
    d = z1.shape[1]
    invariance = np.mean((z1 - z2) ** 2)

    def var_term(z):
        return np.mean(
            [max(0.0, gamma - math.sqrt(np.var(z[:, j], ddof=1) + 1e-4)) for j in range(d)]
        )

    def cov_term(z):
        c = np.cov(z, rowvar=False)  # unbiased
        return sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / d

    return (
        lam * invariance
        + mu * (var_term(z1) + var_term(z2)) / 2
        + nu * (cov_term(z1) + cov_term(z2))
    )


def test_vicreg_matches_numpy():
    z1, z2 = 0.3 * fixed(12, 5, seed=4), 0.3 * fixed(12, 5, seed=5)  # std < 1: the hinge is active
    expected = vicreg_reference(z1, z2, 25.0, 25.0, 1.0, 1.0)
    got = vicreg_loss(t(z1), t(z2), 25.0, 25.0, 1.0, 1.0).item()
    assert got == pytest.approx(expected, rel=1e-10)


def test_vicreg_variance_hinge_closed_form():
    # identical views, uncorrelated columns with std 2 > gamma: only the covariance term is left,
    # and it is 0 for exactly decorrelated columns
    z = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]]) * math.sqrt(3 / 8)
    assert np.allclose(np.cov(z, rowvar=False), np.eye(2))
    assert vicreg_loss(t(z), t(z), gamma=0.5).item() == pytest.approx(0.0, abs=1e-12)
    # gamma = 2: each of the 2 dims misses by 2 - sqrt(1 + 1e-4); both views: (v + v) / 2 = v
    expected = 25.0 * (2 - math.sqrt(1 + 1e-4))
    assert vicreg_loss(t(z), t(z), gamma=2.0).item() == pytest.approx(expected, rel=1e-10)


# --- SimCLR NT-Xent ---------------------------------------------------------------------------


def nt_xent_reference(z1, z2, tau):
    z = np.concatenate([z1, z2])
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    m, n = len(z), len(z1)
    losses = []
    for i in range(m):
        j = (i + n) % m
        denom = sum(math.exp(z[i] @ z[k] / tau) for k in range(m) if k != i)
        losses.append(-math.log(math.exp(z[i] @ z[j] / tau) / denom))
    return float(np.mean(losses))


def test_nt_xent_matches_the_per_anchor_loop():
    z1, z2 = fixed(6, 4, seed=6), fixed(6, 4, seed=7)
    assert nt_xent_loss(t(z1), t(z2), 0.2).item() == pytest.approx(
        nt_xent_reference(z1, z2, 0.2), rel=1e-10
    )


def test_nt_xent_closed_form_for_orthogonal_anchors():
    # identical views of n orthonormal vectors: positive similarity 1, the other 2n - 2 are 0
    n, tau = 3, 0.5
    z = np.eye(n)
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2 * n - 2))
    assert nt_xent_loss(t(z), t(z), tau).item() == pytest.approx(expected, rel=1e-12)


# --- CLIP -------------------------------------------------------------------------------------


def test_clip_matches_the_symmetric_cross_entropy_loop():
    image, text, scale = fixed(5, 4, seed=8), fixed(5, 4, seed=9), 7.0
    a = image / np.linalg.norm(image, axis=1, keepdims=True)
    b = text / np.linalg.norm(text, axis=1, keepdims=True)
    logits = scale * a @ b.T
    i2t = -np.mean([log_softmax(logits[i])[i] for i in range(5)])
    t2i = -np.mean([log_softmax(logits[:, i])[i] for i in range(5)])
    assert clip_loss(t(image), t(text), scale).item() == pytest.approx((i2t + t2i) / 2, rel=1e-10)


# --- DINO -------------------------------------------------------------------------------------


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


# --- MAE --------------------------------------------------------------------------------------


def test_patchify_layout():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float64).reshape(2, 3, 4, 4)
    patches = patchify(x, 2)
    assert patches.shape == (2, 4, 12)
    # patch 1 = rows 0-1, cols 2-3; pixels (row, col, channel)
    expected = [x[0, c, r, 2 + q].item() for r in range(2) for q in range(2) for c in range(3)]
    assert patches[0, 1].tolist() == expected


@pytest.mark.parametrize("norm_pix", [False, True])
def test_mae_loss_matches_the_masked_patch_loop(norm_pix):
    pred, target = fixed(2, 5, 6, seed=40), fixed(2, 5, 6, seed=41)
    mask = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1]], dtype=np.float64)
    errors = []
    for b in range(2):
        for n in range(5):
            if mask[b, n]:
                tgt = target[b, n]
                if norm_pix:
                    tgt = (tgt - tgt.mean()) / math.sqrt(tgt.var(ddof=1) + 1e-6)
                errors.append(np.mean((pred[b, n] - tgt) ** 2))
    got = mae_loss(t(pred), t(target), t(mask), norm_pix).item()
    assert got == pytest.approx(np.mean(errors), rel=1e-10)


# --- supervised -------------------------------------------------------------------------------


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
