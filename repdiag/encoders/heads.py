"""A backbone followed by its projection head, as one module whose taps include ``head``."""

from __future__ import annotations

import torch
from torch import nn


class WithHead(nn.Module):
    """``head(embedding(x))``, where ``embedding`` is the backbone's pooled pre-logits output
    (timm ``forward_head(forward_features(x), pre_logits=True)``, else ``backbone(x)``)."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def embedding(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.backbone, "forward_head"):
            return self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True)
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x))
