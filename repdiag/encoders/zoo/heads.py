"""Projection heads: an MLP described by a small JSON-able dict, rebuilt from that dict alone.

``meta.json["head"]`` holds the description and ``model.safetensors`` the head's weights under
``head.*``, so embedding extraction can tap the ``head`` layer of a zoo encoder.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from repdiag.core.errors import EncoderError

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}
NORMS = {"batch": nn.BatchNorm1d, "layer": nn.LayerNorm}


class MLPHead(nn.Module):
    """``Linear -> [norm] -> act`` for every hidden layer, then a final ``Linear`` (no norm/act).

    ``bias`` applies to the final layer only (hidden layers always have one).
    """

    def __init__(
        self,
        dims: Sequence[int],
        norm: str | None = None,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if len(dims) < 2:
            raise EncoderError(f"a head needs input and output widths, got dims={list(dims)}")
        if norm is not None and norm not in NORMS:
            raise EncoderError(f"unknown head norm {norm!r}; choose one of {sorted(NORMS)} or null")
        if activation not in ACTIVATIONS:
            raise EncoderError(
                f"unknown head activation {activation!r}; choose one of {sorted(ACTIVATIONS)}"
            )
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
            last = i == len(dims) - 2
            layers.append(nn.Linear(d_in, d_out, bias=bias if last else True))
            if not last:
                if norm is not None:
                    layers.append(NORMS[norm](d_out))
                layers.append(ACTIVATIONS[activation]())
        self.net = nn.Sequential(*layers)
        self.description = {
            "type": "mlp",
            "dims": [int(d) for d in dims],
            "norm": norm,
            "activation": activation,
            "bias": bool(bias),
        }

    def forward(self, x):
        return self.net(x)


def build_head(description: Mapping[str, Any] | None) -> MLPHead | None:
    """Rebuild a head from ``meta.json["head"]`` (``None`` -> no head)."""
    if description is None:
        return None
    if description.get("type") != "mlp":
        raise EncoderError(
            f"unknown head type {description.get('type')!r} in meta.json (expected 'mlp')"
        )
    return MLPHead(
        description["dims"],
        description.get("norm"),
        description.get("activation", "relu"),
        description.get("bias", True),
    )
