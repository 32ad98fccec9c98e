"""MAE (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners", sec. 3): encode a
random 25 % of the patches, reconstruct the pixels of the masked ones with a light decoder."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from timm.models.vision_transformer import Block
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.augment import mae_view
from repdiag.encoders.zoo.backbones import feature_dim, is_vit, vit_encode_tokens, vit_patch_tokens
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, 3, H, W) -> (B, H W / p^2, p^2 3), patches row-major, pixels (row, col, channel)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(
        b, (h // patch) * (w // patch), patch * patch * c
    )


def mae_loss(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix: bool
) -> torch.Tensor:
    """``L = sum_n m_n mean_k (pred_nk - t_nk)^2 / sum_n m_n`` over masked patches ``m_n = 1``.

    With ``norm_pix`` each target patch is standardised, ``t = (t - mean) / sqrt(var + 1e-6)``
    (unbiased variance, as the reference code).
    """
    if norm_pix:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.0e-6) ** 0.5
    per_patch = (pred - target).pow(2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum()


def sincos_pos_embed(dim: int, grid: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding (1, 1 + grid^2, dim), class token at 0 (MAE)."""
    if dim % 4:
        raise ConfigError(f"zoo.hparams.mae.decoder_dim must be a multiple of 4, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4))
    ys, xs = np.meshgrid(
        np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij"
    )
    parts = []
    for coord in (xs.reshape(-1), ys.reshape(-1)):
        angles = np.outer(coord, omega)
        parts += [np.sin(angles), np.cos(angles)]
    table = np.concatenate([np.zeros((1, dim)), np.concatenate(parts, axis=1)], axis=0)
    return torch.from_numpy(table).float().unsqueeze(0)


@register
class MAE(Objective):
    """ViT encoder on the visible patches; decoder: linear, mask tokens, blocks, pixel head."""

    name = "mae"
    family = "masked_modeling"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        mask_ratio: float,
        decoder_dim: int,
        decoder_depth: int,
        decoder_heads: int,
        norm_pix_loss: bool,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        if not is_vit(backbone):
            raise ConfigError("the mae objective needs a ViT backbone (patch tokens to mask)")
        if decoder_dim % decoder_heads:
            raise ConfigError(
                f"zoo.hparams.mae.decoder_heads ({decoder_heads}) must divide decoder_dim ({decoder_dim})"
            )
        self.patch = int(backbone.patch_embed.patch_size[0])
        grid = self.image_size // self.patch
        self.n_patches = grid * grid
        self.n_keep = max(1, round(self.n_patches * (1 - mask_ratio)))
        self.norm_pix_loss = norm_pix_loss
        self.decoder_embed = nn.Linear(feature_dim(backbone), decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        nn.init.normal_(self.mask_token, std=0.02)
        self.register_buffer(
            "decoder_pos_embed", sincos_pos_embed(decoder_dim, grid), persistent=False
        )
        self.decoder_blocks = nn.Sequential(
            *[
                Block(decoder_dim, decoder_heads, mlp_ratio=2.0, qkv_bias=True)
                for _ in range(decoder_depth)
            ]
        )
        self.decoder_norm = nn.LayerNorm(decoder_dim)
        self.decoder_pred = nn.Linear(decoder_dim, self.patch * self.patch * 3)
        self.view = mae_view(self.image_size)

    def random_keep(
        self, batch_size: int, gen: torch.Generator, device: torch.device
    ) -> torch.Tensor:
        """Indices (B, n_keep) of the visible patches: the first of a random permutation."""
        noise = torch.rand(batch_size, self.n_patches, generator=gen)
        return torch.argsort(noise, dim=1)[:, : self.n_keep].to(device)

    def reconstruct(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Predicted pixels (B, N, p^2 3) of every patch from the visible ones."""
        tokens = vit_patch_tokens(self.backbone, x)
        b, n, d = tokens.shape
        visible = torch.gather(tokens, 1, keep.unsqueeze(-1).expand(-1, -1, d))
        latent = self.decoder_embed(vit_encode_tokens(self.backbone, visible))
        full = self.mask_token.expand(b, n, -1).clone()
        full = full.scatter(1, keep.unsqueeze(-1).expand(-1, -1, full.shape[-1]), latent[:, 1:])
        y = torch.cat([latent[:, :1], full], dim=1) + self.decoder_pos_embed
        return self.decoder_pred(self.decoder_norm(self.decoder_blocks(y)))[:, 1:]

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        x = self.normalize(self.view(batch.images, gen))
        keep = self.random_keep(x.shape[0], gen, x.device)
        mask = torch.ones(x.shape[0], self.n_patches, device=x.device).scatter(1, keep, 0.0)
        pred = self.reconstruct(x, keep)
        return mae_loss(pred, patchify(x, self.patch), mask, self.norm_pix_loss)

    def trivial_loss(self, batch: Batch) -> float:
        """Predicting each patch's mean: with normalised targets the loss is (P - 1) / P for P
        values a patch (unbiased variance), otherwise the pixels' variance within patches."""
        values = self.patch * self.patch * 3
        if self.norm_pix_loss:
            return (values - 1) / values
        patches = patchify(self.normalize(batch.images), self.patch)
        return float(patches.var(dim=-1, unbiased=False).mean())
