"""``source: python`` image-text models for the SugarCrepe tests, right or wrong by construction.

``ColourCode`` reads the code of a fixture image from its red channel and embeds it as the one-hot
vector e_code; a text is embedded as e_{vocabulary[text]}, or as e_other (orthogonal to every
image) when the text is not in the vocabulary. With the positive captions in the vocabulary,
cos(image, caption) = 1 > 0 = cos(image, negative): every example is correct.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tests.sugarcrepe.fixture import RED0, RED_STEP


class ColourCode(nn.Module):
    preprocess_cfg: ClassVar[dict] = {
        "input_size": 8,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        "interpolation": "bilinear",
    }

    def __init__(self, vocabulary: dict[str, int] | None = None, n_codes: int = 8) -> None:
        super().__init__()
        self.vocabulary = dict(vocabulary or {})
        self.n_codes = n_codes
        self.register_buffer("scale", torch.ones(()))  # a tensor to move between devices

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        red = x[:, 0].mean(dim=(1, 2)) * 255.0
        code = torch.round((red - RED0) / RED_STEP).long().clamp(0, self.n_codes - 1)
        return F.one_hot(code, self.n_codes + 1).float() * self.scale

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return torch.tensor([self.vocabulary.get(t, self.n_codes) for t in texts])

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.one_hot(tokens, self.n_codes + 1).float() * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_image(x)


class ImageOnly(nn.Module):
    """Has no text tower: SugarCrepe must refuse it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)
