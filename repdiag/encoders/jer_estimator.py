"""A stochastic Jacobian effective rank, cheap and differentiable enough for a training step.

For one input x and J = d f(x) / d x (d_out x d_in) with singular values s, Gaussian probes
v ~ N(0, I) give (Hutchinson 1989)

    E ||J v||^2 = ||J||_F^2 = sum s^2,        E ||J^T J v||^2 = ||J^T J||_F^2 = sum s^4,

so the participation ratio of the eigenvalues of J^T J,

    PR_2 = (sum s^2)^2 / sum s^4 = ||J||_F^4 / ||J^T J||_F^2,

is estimated from m probes by (mean_i ||J v_i||^2)^2 / mean_i ||J^T J v_i||^2: one
Jacobian-vector product (two reverse passes, the double-backward trick) and one
vector-Jacobian product per probe, all probes in one batched pass. It is the engine's ``pr2`` formula
(:func:`repdiag.encoders.jacobian.jer.jer`), a ratio of consistent estimates (biased for small m,
exact as m grows). The paper's JER is the singular-value ratio ``pr`` = (sum s)^2 / sum s^2;
the two move together (both count how many directions carry the map), and the workflow's own
engine, not this estimate, measures the JER an intervention produced.

``f`` must treat the images of a batch independently (eval-mode BatchNorm, no cross-sample
attention), so that row b of J v is J_b v_b.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def probe_norms(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    n_probes: int,
    generator: torch.Generator | None = None,
    create_graph: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(||J v_i||^2, ||J^T J v_i||^2) per image and probe, each (B, n_probes).

    The probes are evaluated together: the batch is repeated ``n_probes`` times (row
    ``i * B + b`` is image b under probe i), so one double-backward pass serves them all.
    ``create_graph=True`` keeps both differentiable with respect to ``fn``'s parameters.
    """
    if n_probes < 1:
        raise ValueError(f"n_probes must be >= 1 (got {n_probes})")
    n = x.shape[0]
    # also under no_grad (evaluation): the products need a graph. Fused attention kernels (flash,
    # memory-efficient) have no double backward; the math kernel computes the same attention.
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        rows = x.detach().repeat(n_probes, *[1] * (x.ndim - 1)).requires_grad_(True)
        y = fn(rows).flatten(1)
        # J^T w as a function of a dummy w: its derivative in w along v is J v (double backward)
        w = torch.zeros_like(y, requires_grad=True)
        (jt_w,) = torch.autograd.grad(y, rows, grad_outputs=w, create_graph=True)
        # drawn where the generator lives (torch refuses a CPU generator for CUDA tensors), then
        # moved: a CPU generator gives the same probes on every device
        draw_on = x.device if generator is None else generator.device
        v = torch.randn(rows.shape, generator=generator, dtype=x.dtype, device=draw_on)
        v = v.to(x.device)
        (jv,) = torch.autograd.grad(jt_w, w, grad_outputs=v, create_graph=create_graph)
        (jtjv,) = torch.autograd.grad(y, rows, grad_outputs=jv, create_graph=create_graph)
    forward = jv.flatten(1).square().sum(1).view(n_probes, n).T
    backward = jtjv.flatten(1).square().sum(1).view(n_probes, n).T
    return forward, backward


def estimate_pr2(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    n_probes: int = 4,
    generator: torch.Generator | None = None,
    create_graph: bool = False,
) -> torch.Tensor:
    """(mean_i ||J v_i||^2)^2 / mean_i ||J^T J v_i||^2 per image, (B,); 0 where J = 0."""
    forward, backward = probe_norms(fn, x, n_probes, generator, create_graph)
    numerator, denominator = forward.mean(1) ** 2, backward.mean(1)
    zero = denominator == 0
    return torch.where(
        zero, torch.zeros_like(numerator), numerator / torch.where(zero, 1, denominator)
    )
