"""CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision", fig. 3): symmetric InfoNCE between image and caption embeddings, with a tiny text
transformer over the scene captions and a learned temperature."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.encoders.zoo.augment import caption_safe_view
from repdiag.encoders.zoo.backbones import feature_dim
from repdiag.encoders.zoo.heads import MLPHead
from repdiag.encoders.zoo.objectives.base import Batch, Objective, register
from repdiag.encoders.zoo.scenes import SceneSettings, bag_caption, caption_vocabulary

MAX_LOGIT_SCALE = 100.0  # CLIP clips the learned scale at 100 (temperature >= 0.01)


def clip_loss(
    image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor | float
) -> torch.Tensor:
    """``L = [CE(s I T^T, diag) + CE(s T I^T, diag)] / 2`` with ``I``, ``T`` l2-normalised and
    ``s = exp(log_scale)``: caption ``i`` is the positive of image ``i`` and vice versa."""
    image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    logits = logit_scale * image @ text.T
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


class Tokenizer:
    """Word-level tokenizer of scene captions: ``<pad>`` = 0, ``<eot>`` = 1, then the words."""

    PAD, EOT = 0, 1

    def __init__(self, words: Sequence[str], max_words: int) -> None:
        self.index = {w: i + 2 for i, w in enumerate(words)}
        self.context = max_words + 1

    def __len__(self) -> int:
        return len(self.index) + 2

    def __call__(self, captions: Sequence[str]) -> torch.Tensor:
        """(B, context) long token ids, ``<eot>`` after the last word, then padding."""
        out = torch.full((len(captions), self.context), self.PAD, dtype=torch.long)
        for row, text in enumerate(captions):
            words = text.replace(",", " , ").split()
            if len(words) >= self.context:
                raise ValueError(f"caption longer than {self.context - 1} words: {text!r}")
            try:
                ids = [self.index[w] for w in words] + [self.EOT]
            except KeyError as err:
                raise ValueError(f"caption word {err.args[0]!r} is not in the vocabulary") from None
            out[row, : len(ids)] = torch.tensor(ids)
        return out


class TextEncoder(nn.Module):
    """Token + position embeddings, pre-norm transformer layers, features at ``<eot>``, projection."""

    def __init__(
        self, vocab: int, context: int, width: int, depth: int, heads: int, embed_dim: int
    ) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.01)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )  # fmt: skip
        self.transformer = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.projection = nn.Linear(width, embed_dim, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token(tokens) + self.position
        x = self.norm(self.transformer(x, src_key_padding_mask=tokens == Tokenizer.PAD))
        eot = (tokens == Tokenizer.EOT).int().argmax(dim=1)
        return self.projection(x[torch.arange(x.shape[0]), eot])


@register
class CLIP(Objective):
    """Image tower = backbone + linear projection (the saved head); text tower over captions."""

    name = "clip"
    family = "vision_language"

    def __init__(
        self,
        backbone: nn.Module,
        scenes: SceneSettings,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        *,
        embed_dim: int,
        text_width: int,
        text_depth: int,
        text_heads: int,
        init_temperature: float,
        captions: str,
    ) -> None:
        super().__init__(backbone, scenes, mean, std)
        if captions not in ("bag", "relational"):
            raise ValueError(f"zoo.hparams.clip.captions: unknown caption kind {captions!r}")
        self.captions = captions
        # a caption has at most 5 words per object: colour shape row col ","
        self.tokenizer = Tokenizer(caption_vocabulary(scenes), 5 * scenes.max_objects)
        self.text = TextEncoder(
            len(self.tokenizer),
            self.tokenizer.context,
            text_width,
            text_depth,
            text_heads,
            embed_dim,
        )
        self.image_projection = MLPHead([feature_dim(backbone), embed_dim], bias=False)
        self.log_scale = nn.Parameter(torch.tensor(math.log(1 / init_temperature)))
        self.view = caption_safe_view(self.image_size)

    def loss(self, batch: Batch, gen: torch.Generator) -> torch.Tensor:
        image = self.image_projection(self.backbone(self.normalize(self.view(batch.images, gen))))
        text = self.text(self.tokenizer(self.caption_texts(batch)).to(image.device))
        scale = self.log_scale.exp().clamp(max=MAX_LOGIT_SCALE)
        return clip_loss(image, text, scale)

    def trivial_loss(self, batch: Batch) -> float:
        """Image and text embeddings that ignore their input: uniform logits, log B each way."""
        return math.log(batch.images.shape[0])

    def caption_texts(self, batch: Batch) -> list[str]:
        """The batch's relational captions, or position-free ones built from its labels (their
        host copy when the batch has one: no wait for the device)."""
        if self.captions == "relational":
            return batch.captions
        if batch.host_labels is not None:
            shapes, colours = (labels.tolist() for labels in batch.host_labels)
        else:
            shapes, colours = batch.slot_shape.tolist(), batch.slot_colour.tolist()
        return [bag_caption(s, c, self.scenes) for s, c in zip(shapes, colours, strict=True)]

    def export(self) -> tuple[nn.Module, MLPHead]:
        return self.backbone, self.image_projection
