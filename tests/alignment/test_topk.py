"""TopK SAE core: sparsity, unit-norm decoder, dead latents, AuxK (repdiag.alignment.topk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.alignment.metrics import dead_latents
from repdiag.alignment.optim import Adam
from repdiag.alignment.topk import TopKSAE, topk_relu, unit_mean_square_scale
from repdiag.core.errors import ConfigError

torch.set_num_threads(1)


def _sae(d_in=6, n_latents=10, k=3, dead_after=4096, **kwargs):
    generator = torch.Generator().manual_seed(0)
    return TopKSAE(d_in, n_latents, k, dead_after=dead_after, generator=generator, **kwargs)


def test_topk_keeps_exactly_the_k_largest():
    pre = torch.tensor([[0.5, 3.0, 1.0, 2.0, 0.1], [5.0, 4.0, 3.0, 2.0, 1.0]])
    z = topk_relu(pre, 2)
    expected = torch.tensor([[0.0, 3.0, 0.0, 2.0, 0.0], [5.0, 4.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(z, expected)
    # negative pre-activations among the top k are cut by the ReLU: at most k active
    assert torch.count_nonzero(topk_relu(torch.tensor([[1.0, -1.0, -2.0]]), 2)) == 1


def test_sae_codes_have_exactly_k_active_latents():
    sae = _sae(k=3)
    with torch.no_grad():
        sae.b_enc.fill_(10.0)  # every pre-activation positive: TopK alone sets the support
    z = sae.encode(torch.randn(64, 6, generator=torch.Generator().manual_seed(1)))
    assert torch.all(torch.count_nonzero(z, dim=1) == 3)
    x_hat, codes = sae(torch.randn(8, 6))
    assert x_hat.shape == (8, 6) and torch.all(torch.count_nonzero(codes, dim=1) <= 3)


def test_initialisation_unit_columns_and_encoder_is_decoder_transpose():
    sae = _sae()
    torch.testing.assert_close(sae.decoder.norm(dim=0), torch.ones(10))
    torch.testing.assert_close(sae.encoder, sae.decoder.T)
    with pytest.raises(ConfigError, match="k=11"):
        TopKSAE(6, 10, 11, dead_after=4096)


def test_decoder_columns_stay_unit_norm_after_optimiser_steps():
    sae = _sae()
    optimiser = Adam(sae.parameters(), lr=0.05)
    x = torch.randn(128, 6, generator=torch.Generator().manual_seed(2))
    for _ in range(20):
        x_hat, _ = sae(x)
        loss = (x_hat - x).pow(2).sum(-1).mean()
        optimiser.zero_grad()
        loss.backward()
        sae.remove_parallel_grad()
        # the gradient left has no component along its column
        parallel = (sae.decoder.grad * sae.decoder).sum(0)
        torch.testing.assert_close(parallel, torch.zeros(10), atol=1e-6, rtol=0)
        optimiser.step()
        sae.normalise_decoder()
        torch.testing.assert_close(sae.decoder.norm(dim=0), torch.ones(10))
    assert not torch.allclose(sae.encoder, sae.decoder.T)  # it did train


def test_dead_latent_tracking_on_a_constructed_case():
    sae = _sae(n_latents=4, dead_after=250)
    z_first = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 100)  # latents 0, 1 fire
    z_later = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 100)  # only latent 0 fires
    sae.track(z_first)
    assert sae.samples_since_fired.tolist() == [0, 0, 100, 100]
    sae.track(z_later)
    sae.track(z_later)
    assert sae.samples_since_fired.tolist() == [0, 200, 300, 300]
    assert sae.dead_mask().tolist() == [False, False, True, True]
    sae.track(z_later)  # latent 1: 300 samples without firing
    assert sae.dead_mask().tolist() == [False, True, True, True]
    codes = torch.cat([z_first, z_later]).numpy()
    assert dead_latents(codes) == 2


def test_auxk_rebuilds_the_residual_from_dead_latents_only():
    sae = _sae(d_in=3, n_latents=4, k=1, dead_after=0)
    with torch.no_grad():
        sae.decoder.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 1.0]]))
    pre = torch.tensor([[0.3, 2.0, 0.5, -1.0], [0.1, 0.2, 1.5, 0.4]], requires_grad=True)
    residual = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    # no dead latent: no loss
    assert sae.auxk_loss(pre, residual, aux_k=2).item() == 0.0
    sae.samples_since_fired.copy_(torch.tensor([5, 0, 5, 5]))  # latents 0, 2, 3 dead
    loss = sae.auxk_loss(pre, residual, aux_k=1)
    # row 0: top dead pre is latent 2 (0.5) -> rebuilt (0, 0, 0.5); row 1: latent 2 (1.5) -> (0, 0, 1.5)
    errors = (0.5**2) + (1.0**2 + 1.5**2)
    centred = residual - residual.mean(0)
    expected = (errors / 2) / (centred.pow(2).sum(-1).mean().item())
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert pre.grad[:, 1].abs().sum() == 0  # a live latent gets no AuxK gradient


def test_permute_latents_reorders_codes():
    sae = _sae()
    x = torch.randn(16, 6)
    order = np.array([3, 1, 4, 0, 2, 9, 8, 7, 6, 5])
    before = sae.encode(x)
    sae.permute_latents(order)
    torch.testing.assert_close(sae.encode(x), before[:, order])
    torch.testing.assert_close(sae.decode(sae.encode(x)), sae.decode(before[:, order]))


def test_unit_mean_square_scale():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])  # squared norms 25 and 0: mean 12.5
    assert unit_mean_square_scale(x) == pytest.approx(np.sqrt(12.5))
    with pytest.raises(ValueError, match="zero"):
        unit_mean_square_scale(np.zeros((3, 2)))
