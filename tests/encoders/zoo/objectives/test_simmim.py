"""SimMIM: the L1 loss on masked pixels only and whole-patch masks at the configured ratio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.objectives.simmim import patch_mask, simmim_loss


def test_simmim_loss_is_the_l1_error_on_masked_pixels_only():
    rng = np.random.default_rng(0)
    pred, target = rng.normal(size=(2, 3, 8, 8)), rng.normal(size=(2, 3, 8, 8))
    mask = (rng.random((2, 1, 8, 8)) < 0.5).astype(float)
    expected = sum(
        abs(pred[b, c, y, x] - target[b, c, y, x])
        for b in range(2) for c in range(3) for y in range(8) for x in range(8) if mask[b, 0, y, x]
    ) / (3 * mask.sum())  # fmt: skip
    got = simmim_loss(*(torch.tensor(a) for a in (pred, target, mask)))
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_simmim_masks_whole_patches_at_the_configured_ratio():
    mask = patch_mask(4, 64, 8, 0.6, torch.Generator().manual_seed(0))
    assert mask.shape == (4, 1, 64, 64)
    cells = mask[:, 0, ::8, ::8]
    assert torch.equal(mask, cells.repeat_interleave(8, 1).repeat_interleave(8, 2)[:, None])
    assert torch.all(cells.sum(dim=(1, 2)) == round(0.6 * 64))
