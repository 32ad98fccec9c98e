"""MAE: patchify layout, the masked-patch loss against a loop, the mask fraction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.objectives.mae import mae_loss, patchify
from repdiag.encoders.zoo.train import build_objective
from tests.encoders.zoo.objectives.reference import fixed, t


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


def test_mae_masks_the_configured_fraction(tiny_spec):
    objective, _ = build_objective(tiny_spec("mae"), "cpu")
    keep = objective.random_keep(4, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert keep.shape == (4, 4)  # 32 px / patch 8 = 16 patches, 25 % visible
    assert all(len(set(row.tolist())) == 4 for row in keep)
