"""Distances between distributions, differentiable in torch (for the distributional objectives)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def random_directions(
    dim: int, n_projections: int, generator: torch.Generator | None = None, *, dtype=torch.float32
) -> Tensor:
    """``(dim, n_projections)`` directions uniform on the unit sphere."""
    theta = torch.randn(dim, n_projections, generator=generator, dtype=dtype)
    return theta / theta.norm(dim=0, keepdim=True)


def sort_columns(values: Tensor) -> Tensor:
    """Each column sorted ascending, differentiably (gather along the sorting permutation).

    On CPU the permutation comes from NumPy's argsort, many times faster than ``torch.sort`` on
    the small matrices used here; the gather keeps the gradient exact either way.
    """
    if values.device.type != "cpu":
        return torch.sort(values, dim=0).values
    order = np.argsort(values.detach().numpy(), axis=0, kind="stable")
    return values.gather(0, torch.from_numpy(order))


def _resample_sorted(sorted_values: Tensor, n: int) -> Tensor:
    """Quantiles ``(i + 1/2)/n`` of the empirical law whose sorted samples are the rows given."""
    m = sorted_values.shape[0]
    if m == n:
        return sorted_values
    position = (
        (torch.arange(n, dtype=sorted_values.dtype, device=sorted_values.device) + 0.5) / n
    ) * m - 0.5
    position = position.clamp(0, m - 1)
    low = position.floor().long()
    high = (low + 1).clamp(max=m - 1)
    weight = (position - low).unsqueeze(1)
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


def sliced_wasserstein(
    x: Tensor,
    y: Tensor,
    n_projections: int = 64,
    generator: torch.Generator | None = None,
    *,
    directions: Tensor | None = None,
) -> Tensor:
    """Sliced 2-Wasserstein distance squared, scaled to the squared-norm scale of the inputs.

        SW(mu, nu) = d * E_theta [ W_2^2(theta # mu, theta # nu) ]

    (Rabin et al. 2011; Bonneel et al. 2015), estimated with ``n_projections`` random unit
    directions. In one dimension W_2^2 between empirical laws is the mean squared difference of
    sorted samples (quantile functions; unequal sizes are matched at common quantile levels).
    The factor ``d`` makes it comparable with ``||x - y||^2`` losses: for an isotropic shift
    ``mu = nu + t`` it equals ``||t||^2``.
    """
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"sliced Wasserstein needs equal dimensions, got {x.shape[1]} and {y.shape[1]}"
        )
    dim = x.shape[1]
    if directions is None:
        directions = random_directions(dim, n_projections, generator, dtype=x.dtype).to(x.device)
    px = sort_columns(x @ directions)
    py = sort_columns(y @ directions)
    n = max(px.shape[0], py.shape[0])
    px, py = _resample_sorted(px, n), _resample_sorted(py, n)
    return dim * (px - py).pow(2).mean()
