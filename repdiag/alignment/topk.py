"""TopK sparse autoencoder core (Gao et al. 2024, "Scaling and evaluating sparse autoencoders").

    z = ReLU(TopK_k(W_enc (x - b_dec) + b_enc)),    x_hat = D z + b_dec

with the conventions of the well-kept SAE libraries (OpenAI ``sparse_autoencoder``, ``sae-lens``,
``dictionary_learning``): the decoder ``D`` (d_in x n_latents) has unit-norm columns, kept so by
removing the gradient component parallel to each column before every optimiser step and
renormalising after it; the encoder is initialised as ``D^T``; ``b_dec`` starts at the data mean;
inputs are normalised to unit mean squared norm (see :func:`unit_mean_square_scale`); a latent
is dead when it has not fired for ``dead_after`` training samples, and the auxiliary loss AuxK
reconstructs the residual with the ``aux_k`` largest dead pre-activations, pulling dead latents
back into use.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from repdiag.core.errors import ConfigError


def topk_relu(pre: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest entries of each row (then ReLU), zero the rest."""
    values, indices = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, indices, values.relu())


def unit_mean_square_scale(x: np.ndarray | Tensor) -> float:
    """``s = sqrt(mean_n ||x_n||^2)``: dividing by ``s`` gives inputs of unit mean squared norm."""
    x = torch.as_tensor(x, dtype=torch.float64)
    scale = float(x.pow(2).sum(-1).mean().sqrt())
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError("cannot normalise inputs with zero or non-finite norm")
    return scale


class TopKSAE(nn.Module):
    """One TopK SAE on ``d_in``-dimensional inputs with ``n_latents`` dictionary atoms."""

    def __init__(
        self,
        d_in: int,
        n_latents: int,
        k: int,
        *,
        dead_after: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= k <= n_latents:
            raise ConfigError(f"TopK SAE: k={k} must lie in [1, n_latents={n_latents}]")
        self.d_in, self.n_latents, self.k, self.dead_after = d_in, n_latents, k, dead_after
        decoder = torch.randn(d_in, n_latents, generator=generator)
        decoder /= decoder.norm(dim=0, keepdim=True)
        self.decoder = nn.Parameter(decoder)
        self.encoder = nn.Parameter(decoder.T.clone())
        self.b_enc = nn.Parameter(torch.zeros(n_latents))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        self.register_buffer("samples_since_fired", torch.zeros(n_latents, dtype=torch.long))

    # forward pieces ---------------------------------------------------------------------------
    def project(self, x: Tensor) -> Tensor:
        """``W_enc (x - b_dec)``, the encoder's linear part without its bias."""
        return (x - self.b_dec) @ self.encoder.T

    def pre_activation(self, x: Tensor) -> Tensor:
        return self.project(x) + self.b_enc

    def encode(self, x: Tensor) -> Tensor:
        return topk_relu(self.pre_activation(x), self.k)

    def decode(self, z: Tensor) -> Tensor:
        return z @ self.decoder.T + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encode(x)
        return self.decode(z), z

    # dead latents -----------------------------------------------------------------------------
    @torch.no_grad()
    def track(self, z: Tensor) -> None:
        """Count samples since each latent last fired; a latent firing in ``z`` resets to 0."""
        fired = (z > 0).any(dim=0)
        self.samples_since_fired += z.shape[0]
        self.samples_since_fired[fired] = 0

    def dead_mask(self) -> Tensor:
        return self.samples_since_fired > self.dead_after

    def auxk_loss(self, pre: Tensor, residual: Tensor, aux_k: int) -> Tensor:
        """AuxK: normalised MSE of the residual ``x - x_hat`` rebuilt from the top dead latents.

        ``||e - D z_aux||^2 / ||e - mean(e)||^2`` where ``z_aux`` keeps the ``aux_k`` largest
        pre-activations among dead latents (Gao et al. 2024, Sec. A.2). Zero with no dead latent.
        """
        dead = self.dead_mask()
        n_dead = int(dead.sum())
        if n_dead == 0 or aux_k <= 0:
            return pre.new_zeros(())
        masked = pre.masked_fill(~dead, float("-inf"))
        z_aux = topk_relu(masked, min(aux_k, n_dead)).nan_to_num(0.0)
        residual = residual.detach()
        rebuilt = z_aux @ self.decoder.T
        scale = (residual - residual.mean(0)).pow(2).sum(-1).mean().clamp_min(1e-8)
        return (rebuilt - residual).pow(2).sum(-1).mean() / scale

    # unit-norm decoder ------------------------------------------------------------------------
    @torch.no_grad()
    def init_decoder_bias(self, x: Tensor) -> None:
        self.b_dec.copy_(x.mean(0))

    @torch.no_grad()
    def remove_parallel_grad(self) -> None:
        """Project out of each column's gradient its component along the column."""
        if self.decoder.grad is not None:
            parallel = (self.decoder.grad * self.decoder).sum(0, keepdim=True)
            self.decoder.grad -= parallel * self.decoder

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        self.decoder /= self.decoder.norm(dim=0, keepdim=True).clamp_min(1e-8)

    @torch.no_grad()
    def permute_latents(self, order: np.ndarray | Tensor) -> None:
        """Reorder latents so that new latent ``l`` is old latent ``order[l]``."""
        order = torch.as_tensor(np.asarray(order), dtype=torch.long)
        self.encoder.copy_(self.encoder[order])
        self.b_enc.copy_(self.b_enc[order])
        self.decoder.copy_(self.decoder[:, order])
        self.samples_since_fired.copy_(self.samples_since_fired[order])
