"""The Jacobian effective rank (JER) of a spectrum: the binding paper's participation ratio of
singular values (Chung and Kim 2026, Eq. 1) and two alternatives, in the :data:`FORMULAS`
registry."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from repdiag.core.registry import Registry

FORMULAS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("JER formula")


@FORMULAS.register("pr")
def _participation_of_singular_values(s: torch.Tensor) -> torch.Tensor:
    """(sum s)^2 / sum s^2: the paper's JER (Chung and Kim 2026, Eq. 1)."""
    return s.sum(-1) ** 2 / (s**2).sum(-1)


@FORMULAS.register("pr2")
def _participation_of_eigenvalues(s: torch.Tensor) -> torch.Tensor:
    """(sum s^2)^2 / sum s^4: participation ratio of the eigenvalues s^2 of J J^T."""
    power = s**2
    return power.sum(-1) ** 2 / (power**2).sum(-1)


@FORMULAS.register("entropy")
def _entropy_effective_rank(s: torch.Tensor) -> torch.Tensor:
    """exp(-sum p log p) with p = s / sum s (Roy and Vetterli 2007); 0 log 0 = 0."""
    p = s / s.sum(-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(-1))


def jer(
    singular_values: torch.Tensor | np.ndarray,
    formula: str = "pr",
    top_k: int | None = None,
) -> torch.Tensor:
    """Effective rank of each spectrum in ``singular_values`` (..., rank): one value per image.

    ``formula``: ``pr`` (sum s)^2/sum s^2 (the paper's JER), ``pr2`` (sum s^2)^2/sum s^4 or
    ``entropy`` exp(H(s/sum s)). ``top_k`` keeps the k leading values first (the paper's JER is
    over the top k = 32, so it is at most k). A spectrum of zeros (a constant readout) has rank 0.
    """
    fn = FORMULAS.get(formula)
    s = torch.as_tensor(singular_values)
    if not s.is_floating_point():
        s = s.double()
    s = s.abs()
    if top_k is not None:
        s = s.sort(dim=-1, descending=True).values[..., :top_k]
    zero = s.sum(-1) == 0
    values = fn(torch.where(zero[..., None], torch.ones_like(s), s))
    return torch.where(zero, torch.zeros_like(values), values)
