"""The minimal Adam against torch.optim.Adam (repdiag.alignment.optim)."""

from __future__ import annotations

import numpy as np
import torch

from repdiag.alignment.optim import Adam

torch.set_num_threads(1)


def test_adam_matches_torch_optim_adam():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(7, 3, generator=gen)
    start = torch.randn(7, 3, generator=gen)
    ours = torch.nn.Parameter(start.clone())
    reference = torch.nn.Parameter(start.clone())
    ours_opt = Adam([ours], lr=0.05)
    ref_opt = torch.optim.Adam([reference], lr=0.05)
    for step in range(30):
        for p, opt in ((ours, ours_opt), (reference, ref_opt)):
            opt.zero_grad()
            ((p - target) ** 3).abs().sum().backward()
        ours_opt.lr = ref_opt.param_groups[0]["lr"] = 0.05 * (1 - step / 30)
        ours_opt.step()
        ref_opt.step()
    torch.testing.assert_close(ours.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours.detach().numpy(), start.numpy())
