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

Logits come from matrix products (a @ n^T for shared negatives, batched for per-group ones) and
the log-sum-exp runs over the (n, M) logit matrix: O(n M d) flops like the broadcast form but
without its (n, M, d) intermediate, which dominated the step at batch 2000.
"""

from __future__ import annotations

import torch
from torch import nn

from repdiag.core.errors import ConfigError

SIMILARITIES = ("cosine", "dot")


def _check_kind(kind: str) -> None:
    if kind not in SIMILARITIES:
        raise ConfigError(
            f"identifiability.loss.similarity must be one of {SIMILARITIES}, got {kind!r}"
        )


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ConfigError(f"identifiability.loss.temperature must be > 0, got {temperature}")


def _prepare(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x / |x| along the last axis for ``cosine`` (so that s(a, b) = a . b), x itself for ``dot``."""
    _check_kind(kind)
    return nn.functional.normalize(x, dim=-1) if kind == "cosine" else x


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """s(a, b) along the last axis (broadcasting): a.b, or a.b / (|a| |b|) for ``cosine``."""
    return (_prepare(a, kind) * _prepare(b, kind)).sum(-1)


def _info_nce_from_logits(positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """mean_i [ -p_i + logsumexp(p_i, n_i1, ..., n_iM) ] for logits p (n,) and n (n, M).

    Computed as logaddexp(p_i, logsumexp_m n_im) - p_i, which needs no concatenated copy of
    the (n, M) logits; M = 0 gives logsumexp = -inf and a loss of exactly 0.
    """
    return (torch.logaddexp(positive, torch.logsumexp(negatives, dim=1)) - positive).mean()


def _negative_logits(anchor: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """(n, M) logits a_i . n_m by matrix products, for prepared anchors (n, d) and negatives that
    are shared ((M, d): one matmul a @ n^T), per anchor ((n, M, d): a batched matmul) or per
    group of consecutive anchors ((G, M, d) with n = G k: anchors reshaped to (G, k, d), one
    batched matmul (G, k, d) @ (G, d, M))."""
    if negatives.ndim == 2:
        return anchor @ negatives.T
    groups, count, width = negatives.shape
    if groups == 0 or len(anchor) % groups:
        raise ValueError(
            f"{len(anchor)} anchors cannot be split into {groups} groups of per-group negatives"
        )
    grouped = anchor.reshape(groups, len(anchor) // groups, width)
    return torch.bmm(grouped, negatives.transpose(1, 2)).reshape(len(anchor), count)


def info_nce(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    negatives: torch.Tensor,
    temperature: float,
    kind: str = "cosine",
) -> torch.Tensor:
    """InfoNCE (module docstring) with logits from one matrix product.

    ``negatives`` are shared by all anchors (shape (M, d)), per anchor ((n, M, d)) or per group
    of consecutive anchors ((G, M, d), G dividing n). Equal to :func:`info_nce_broadcast`.
    """
    _check_temperature(temperature)
    a, p, neg = _prepare(anchor, kind), _prepare(positive, kind), _prepare(negatives, kind)
    pos = (a * p).sum(-1) / temperature
    return _info_nce_from_logits(pos, _negative_logits(a, neg) / temperature)


def info_nce_broadcast(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    negatives: torch.Tensor,
    temperature: float,
    kind: str = "cosine",
) -> torch.Tensor:
    """The elementwise form: s(a_i, n_m) from an (n, M, d) broadcast product, logsumexp over the
    concatenated (n, 1 + M) logits. The project's loss before the matmul form; kept as the
    reference of the tests and of ``benchmarks/identifiability.py`` (shared or per-anchor
    negatives only). Cost and memory grow with n M d instead of n M."""
    _check_temperature(temperature)
    pos = similarity(anchor, positive, kind) / temperature
    if negatives.ndim == 2:
        neg = similarity(anchor[:, None, :], negatives[None, :, :], kind) / temperature
    else:
        neg = similarity(anchor[:, None, :], negatives, kind) / temperature
    logits = torch.cat([pos[:, None], neg], dim=1)
    return (torch.logsumexp(logits, dim=1) - pos).mean()


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
    """InfoNCE whose denominator mixes constrained negatives, drawn on the anchor's restricted
    sub-manifold, with shared uniform ones ((Mu, d)).

    ``constrained_negatives`` has shape (n, Mc, d) (per anchor) or (G, Mc, d) (shared by each
    group of n / G consecutive anchors, as the training loop draws them). Logits come from one
    batched matmul (constrained) and one matmul (uniform); the log-sum-exp runs over both:
    L_i = -p_i + log(e^p_i + sum_c e^(a_i . c / tau) + sum_u e^(a_i . u / tau)).
    The constrained ratio is Mc / (Mc + Mu) (see :func:`split_negatives`); Mc = 0 gives
    :func:`info_nce`.
    """
    _check_temperature(temperature)
    a, p = _prepare(anchor, kind), _prepare(positive, kind)
    pos = (a * p).sum(-1) / temperature
    uni = a @ _prepare(uniform_negatives, kind).T
    if constrained_negatives.shape[1]:
        con = _negative_logits(a, _prepare(constrained_negatives, kind))
        uni = torch.cat([con, uni], dim=1)
    return _info_nce_from_logits(pos, uni / temperature)
