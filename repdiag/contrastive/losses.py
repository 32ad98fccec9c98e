"""InfoNCE and the support-corrected InfoNCE of the identifiability study (``../shared/seeds/002``).

For an anchor h, its positive h+ and negatives h-_1..M, with similarity s (cosine or dot) and
temperature tau:

    L = -s(h, h+)/tau + log( exp(s(h, h+)/tau) + sum_m exp(s(h, h-_m)/tau) ),

averaged over the anchors (Oord et al. 2018; the form analysed by Zimmermann et al. 2021, with
the positive in the denominator). Standard InfoNCE draws the negatives from the marginal (uniform
on the sphere) and shares them across anchors. Support-corrected InfoNCE draws a fraction
``ratio`` of each anchor's negatives from the restricted sub-manifold of its positive pair (the
same fixed coordinates), so the model's conditional Q_h(.|z) is normalised over the support of
the true conditional; ratio = 0 is standard InfoNCE, ratio = 1 the fully corrected loss.
"""

from __future__ import annotations

import torch
from torch import nn

from repdiag.errors import ConfigError

SIMILARITIES = ("cosine", "dot")


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """s(a, b) along the last axis (broadcasting): a.b, or a.b / (|a| |b|) for ``cosine``."""
    if kind == "cosine":
        a, b = nn.functional.normalize(a, dim=-1), nn.functional.normalize(b, dim=-1)
    elif kind != "dot":
        raise ConfigError(
            f"identifiability.loss.similarity must be one of {SIMILARITIES}, got {kind!r}"
        )
    return (a * b).sum(-1)


def _info_nce_from_logits(positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """mean_i [ -p_i + logsumexp(p_i, n_i1, ..., n_iM) ] for logits p (n,) and n (n, M)."""
    logits = torch.cat([positive[:, None], negatives], dim=1)
    return (torch.logsumexp(logits, dim=1) - positive).mean()


def info_nce(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    negatives: torch.Tensor,
    temperature: float,
    kind: str = "cosine",
) -> torch.Tensor:
    """InfoNCE with ``negatives`` shared by all anchors (shape (M, d)) or per anchor ((n, M, d))."""
    if temperature <= 0:
        raise ConfigError(f"identifiability.loss.temperature must be > 0, got {temperature}")
    pos = similarity(anchor, positive, kind) / temperature
    if negatives.ndim == 2:
        neg = similarity(anchor[:, None, :], negatives[None, :, :], kind) / temperature
    else:
        neg = similarity(anchor[:, None, :], negatives, kind) / temperature
    return _info_nce_from_logits(pos, neg)


def split_negatives(n_negatives: int, ratio: float) -> tuple[int, int]:
    """(constrained, uniform) counts: round(ratio M) negatives from the sub-manifold, the rest uniform."""
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"constrained-negative ratio must be in [0, 1], got {ratio}")
    constrained = round(ratio * n_negatives)
    return constrained, n_negatives - constrained


def support_corrected_info_nce(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    constrained_negatives: torch.Tensor,
    uniform_negatives: torch.Tensor,
    temperature: float,
    kind: str = "cosine",
) -> torch.Tensor:
    """InfoNCE whose denominator mixes per-anchor constrained negatives ((n, Mc, d), drawn on the
    anchor's restricted sub-manifold) with shared uniform ones ((Mu, d)).

    The constrained ratio is Mc / (Mc + Mu) (see :func:`split_negatives`); Mc = 0 gives
    :func:`info_nce`.
    """
    if temperature <= 0:
        raise ConfigError(f"identifiability.loss.temperature must be > 0, got {temperature}")
    pos = similarity(anchor, positive, kind) / temperature
    con = similarity(anchor[:, None, :], constrained_negatives, kind) / temperature
    uni = similarity(anchor[:, None, :], uniform_negatives[None, :, :], kind) / temperature
    return _info_nce_from_logits(pos, torch.cat([con, uni], dim=1))
