"""Explicit forward-mode rules (and their backward) for the ops that move most of the bytes of
the engine's vmapped JVPs: ``linear`` and ``layer_norm``, run by the engine's rewrites
(:class:`repdiag.encoders.jacobian.rewrites._JacobianRewrites`, switch ``tangent_rules``).

Why: the engine differentiates with respect to the input only; weights and biases are constants
(:func:`~repdiag.encoders.jacobian.rewrites.jacobian_mode` freezes them, and the rewrites use these
rules only for frozen ones). torch's own forward-mode rule for ``linear`` (through ``addmm``'s)
still builds the bias's and the weight's zero tangents: per linear, a product of the input with a
zero weight tangent, a copy and two adds of the full tangent size (under ``vmap``, for every
direction). Layer norm's forward-mode formula is a decomposition of about ten elementwise passes
over the tangent. Here the tangents of the weight and the bias are ignored (they are zero in the
engine; a caller who differentiates by the parameters must not use these rules), and each rule is
the textbook derivative:

* linear, ``y = x W^T + b``: ``dy = dx W^T``; backward ``gx = g W``.
* layer norm over the last dims D, ``y = x_hat w + b`` with ``x_hat = (x - mean_D x) r``,
  ``r = (var_D x + eps)^(-1/2)`` (biased variance): ``dy = w r (dx - mean_D dx - x_hat
  mean_D(dx x_hat))``; backward is torch's own ``native_layer_norm_backward``.

The maths is the same as torch's (tested against ``torch.func.jvp``/``vjp`` of the plain ops to
1e-12 in float64); only the intermediates differ. ``benchmarks/bytes_moved.py`` counts the bytes
with and without these rules in one run (the paper's ViT-L pass: 21.1 -> 15.5 TB). Attention is
left to torch: functorch's batching rule for ``bmm`` copies the unbatched primal operand (the
probabilities) once per direction whatever form the rule takes, and ``torch.compile`` of the
vmapped JVP fails in torch 2.14 (``_make_dual`` under fake tensors), so neither lever is used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class _Linear(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_forward(inputs[1])
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, *_constants: torch.Tensor | None) -> torch.Tensor:
        return torch.matmul(tangent, ctx.saved_tensors[0].t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return torch.matmul(grad, ctx.saved_tensors[0]), None, None


class _LayerNorm(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        normalized_shape: tuple[int, ...],
        eps: float,
    ) -> torch.Tensor:
        return nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, normalized_shape, eps = inputs
        dims = tuple(range(-len(normalized_shape), 0))
        mean = x.mean(dims, keepdim=True)
        rstd = torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + eps)
        scale = rstd if weight is None else rstd * weight
        ctx.save_for_forward((x - mean) * rstd, scale)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        ctx.dims, ctx.normalized_shape = dims, list(normalized_shape)

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, *_constants: torch.Tensor | None) -> torch.Tensor:
        x_hat, scale = ctx.saved_tensors
        dims = ctx.dims
        centred = tangent - tangent.mean(dims, keepdim=True)
        along = (tangent * x_hat).mean(dims, keepdim=True)
        return torch.addcmul(centred, x_hat, along, value=-1) * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        x, mean, rstd, weight, bias = ctx.saved_tensors
        grad_x = torch.ops.aten.native_layer_norm_backward(
            grad, x, ctx.normalized_shape, mean, rstd, weight, bias, [True, False, False]
        )[0]
        return grad_x, None, None, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` differentiated by ``x`` only (see the module docstring)."""
    return _Linear.apply(x, weight, bias)


def layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """``F.layer_norm`` differentiated by ``x`` only (see the module docstring)."""
    return _LayerNorm.apply(x, weight, bias, tuple(normalized_shape), float(eps))
