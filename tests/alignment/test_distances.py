"""Sliced Wasserstein in torch (repdiag.alignment.distances)."""

from __future__ import annotations

import pytest
import torch

from repdiag.alignment.distances import sliced_wasserstein, sort_columns

torch.set_num_threads(1)


def test_sort_columns_matches_torch_sort_values_and_gradient():
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    weights = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    (sort_columns(x) * weights).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    (torch.sort(x, dim=0).values * weights).sum().backward()
    torch.testing.assert_close(ours, x.grad)
    torch.testing.assert_close(sort_columns(x), torch.sort(x, dim=0).values)


def test_sliced_wasserstein_in_one_dimension_is_the_sorted_mean_square():
    x = torch.tensor([[3.0], [1.0], [2.0]])
    y = torch.tensor([[0.0], [5.0], [1.0]])
    # sorted (1, 2, 3) vs (0, 1, 5): (1 + 1 + 4) / 3 = 2; d = 1, direction +-1
    value = sliced_wasserstein(x, y, directions=torch.ones(1, 1))
    assert value.item() == pytest.approx(2.0)


def test_sliced_wasserstein_with_an_orthonormal_basis_is_exact_for_a_shift():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    shift = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    value = sliced_wasserstein(x, x + shift, directions=torch.eye(3, dtype=torch.float64))
    assert value.item() == pytest.approx(float(shift.pow(2).sum()))  # d * mean_i t_i^2


def test_sliced_wasserstein_invariances_and_gradient():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 5, generator=gen)
    y = torch.randn(64, 5, generator=gen) * 2
    directions = torch.randn(5, 16, generator=gen)
    directions = directions / directions.norm(dim=0)
    base = sliced_wasserstein(x, y, directions=directions)
    shuffled = sliced_wasserstein(x[torch.randperm(64, generator=gen)], y, directions=directions)
    assert shuffled.item() == pytest.approx(base.item(), rel=1e-6)
    assert sliced_wasserstein(x, x, directions=directions).item() == pytest.approx(0.0, abs=1e-7)
    # unequal sizes: a sample and its duplicate have the same law at matched quantiles
    doubled = torch.cat([y, y])
    assert sliced_wasserstein(x, doubled, directions=directions).item() == pytest.approx(
        base.item(), rel=0.1
    )
    x.requires_grad_(True)
    sliced_wasserstein(x, y, 8, torch.Generator().manual_seed(0)).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="equal dimensions"):
        sliced_wasserstein(x, y[:, :3])
