"""Explicit forward-mode rules (and their backward) for the ops that move most of the bytes of
the engine's vmapped JVPs and VJPs: ``linear``, ``layer_norm`` and attention, run by the
engine's rewrites
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
* attention, ``o = P v`` with ``P = softmax(q k^T s)``: ``dP = P (dS - rowsum(P dS))`` for
  ``dS = s (dq k^T + q dk^T)``, ``do = dP v + P dv`` (softmax's Jacobian is symmetric, so its
  backward is the same three passes). functorch's batching rule for ``bmm`` copies an unbatched
  operand (here the probabilities, tokens x tokens per head) once per direction; this rule takes
  the directions out of functorch's batch (:func:`_explicit`: one vmap level inside at most one
  grad level, as the engine nests them) and lays them out itself, computing on plain tensors
  with functorch's dispatch off and putting the result back at the caller's levels. Any other
  nesting takes the same formulas through torch's rules (:func:`_generic_jvp`).

The maths is the same as torch's (tested against ``torch.func.jvp``/``vjp`` of the plain ops to
1e-12 in float64); only the intermediates differ. ``benchmarks/bytes_moved.py`` counts the bytes
with and without these rules in one run: the paper's ViT-L pass, 21.07 -> 12.48 TB.
``torch.compile`` of the vmapped JVP fails in torch 2.14 (``_make_dual`` under fake tensors), so
the rules are eager. The private functorch calls (``torch._C._functorch``: unwrapping, batch
dimensions, ``_DisableFuncTorch``) are pinned by the tests to torch 2.14.1's behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch._C._functorch as functorch
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # the output with the mean and 1/std it computed, which the derivatives reuse
        return torch.native_layer_norm(x, list(normalized_shape), weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, normalized_shape, _eps = inputs
        _, mean, rstd = output
        ctx.mark_non_differentiable(mean, rstd)
        scale = rstd if weight is None else rstd * weight
        ctx.save_for_forward((x - mean) * rstd, scale)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        ctx.dims, ctx.normalized_shape = tuple(range(-len(normalized_shape), 0)), normalized_shape

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, *_constants: torch.Tensor | None):
        x_hat, scale = ctx.saved_tensors
        dims = ctx.dims
        centred = tangent - tangent.mean(dims, keepdim=True)
        along = (tangent * x_hat).mean(dims, keepdim=True)
        return torch.addcmul(centred, x_hat, along, value=-1) * scale, None, None

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _mean: None, _rstd: None):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        grad_x = torch.ops.aten.native_layer_norm_backward(
            grad, x, list(ctx.normalized_shape), mean, rstd, weight, bias, [True, False, False]
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
    return _LayerNorm.apply(x, weight, bias, tuple(normalized_shape), float(eps))[0]


# ---------------------------------------------------------------------------------------------
# Attention, with the directions kept out of the tokens x tokens products' batch
# ---------------------------------------------------------------------------------------------


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(..., rows, cols) -> (heads, rows, cols): every leading dimension as one bmm batch."""
    return t.reshape(-1, *t.shape[-2:])


@dataclass(frozen=True)
class _Levels:
    """Where torch.func put a tangent: the vmap level of its directions (None: one direction,
    outside vmap) inside at most one grad (jvp/vjp) level (None: none)."""

    vmap: int | None
    grad: int | None

    def wrap(self, directions: torch.Tensor) -> torch.Tensor:
        """(m, ...) plain -> the caller's tensor at these levels."""
        if self.vmap is None:
            with torch._C._DisableFuncTorch():
                out = directions.squeeze(0)
        else:
            out = functorch._add_batch_dim(directions, 0, self.vmap)
        return out if self.grad is None else functorch._wrap_for_grad(out, self.grad)


def _plain_directions(t: torch.Tensor) -> tuple[torch.Tensor, _Levels] | None:
    """``t`` as a plain (m, ...) tensor of its directions and the levels to put the result back
    at; None when torch.func nests it deeper than one vmap inside one grad level."""
    grad = None
    if functorch.is_functorch_wrapped_tensor(t) and not functorch.is_batchedtensor(t):
        grad, t = functorch.maybe_get_level(t), functorch.get_unwrapped(t)
    vmap = bdim = None
    if functorch.is_batchedtensor(t):
        vmap = functorch.maybe_get_level(t)
        t, bdim = functorch._unwrap_batched(t, vmap)
    if functorch.is_functorch_wrapped_tensor(t):
        return None
    with torch._C._DisableFuncTorch():
        t = t.unsqueeze(0) if bdim is None else t.movedim(bdim, 0)
    return t, _Levels(vmap, grad)


def _plain_primal(t: torch.Tensor) -> torch.Tensor | None:
    """A saved primal as a plain tensor (unwrapped from one grad level); None if batched."""
    if functorch.is_functorch_wrapped_tensor(t) and not functorch.is_batchedtensor(t):
        t = functorch.get_unwrapped(t)
    return None if functorch.is_functorch_wrapped_tensor(t) else t


def _explicit(tangents: Sequence[torch.Tensor | None], saved: Sequence[torch.Tensor]):
    """(plain directions, plain primals, levels) when every tangent sits at the same levels
    with the same number of directions and no primal is batched, else None (the generic rule)."""
    if any(t is None for t in tangents):
        return None
    found = [_plain_directions(t) for t in tangents]
    primals = [_plain_primal(t) for t in saved]
    if any(f is None for f in found) or any(p is None for p in primals):
        return None
    if len({(f[1], f[0].shape[0]) for f in found}) != 1:
        return None
    return [f[0] for f in found], primals, found[0][1]


def _softmax_tangent(d: torch.Tensor, probs: torch.Tensor, dim: int) -> torch.Tensor:
    """``probs (d - sum_dim(probs d))``, in place of ``d``: softmax's JVP, and its VJP (its
    Jacobian diag(p) - p p^T is symmetric)."""
    weighted = d.mul_(probs)
    return weighted.addcmul_(probs, weighted.sum(dim, keepdim=True), value=-1)


def _attention_jvp(primals, directions) -> torch.Tensor:
    """d out for m directions: plain (heads, T, .) primals (queries Tq, keys Tk), (m, heads,
    T, .) tangents -> (m, heads, Tq, width). The scores' tangent ``tq k^T + q tk^T`` is one bmm
    over the widths side by side, ``[tq, q] [k, tk]^T``, written once; the probabilities'
    product with ``tv`` takes the directions as columns: the tokens x tokens primal is read
    once, never copied per direction (functorch's generic rules copy it m times)."""
    q, k, v, probs = primals
    tq, tk, tv = directions
    m, heads, queries, keys, width = tv.shape[0], tv.shape[1], q.shape[1], k.shape[1], v.shape[2]
    rows = torch.cat((tq, q.expand(m, *q.shape)), -1).reshape(m * heads, queries, -1)
    columns = torch.cat((k.expand(m, *k.shape), tk), -1).reshape(m * heads, keys, -1)
    d_scores = (rows @ columns.mT).view(m, heads, queries, keys)
    d_probs = _softmax_tangent(d_scores, probs, -1)
    values = v.expand(m, *v.shape).reshape(m * heads, keys, width)
    d_out = (d_probs.view(m * heads, queries, keys) @ values).view(m, heads, queries, width)
    by_direction = tv.permute(1, 2, 0, 3).reshape(heads, keys, m * width)
    d_out += (probs @ by_direction).view(heads, queries, m, width).permute(2, 0, 1, 3)
    return d_out


def _attention_vjp(primals, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) for m cotangents (m, heads, Tq, width), as :func:`_attention_jvp` lays
    them out; the scores' cotangent is built transposed, (heads, key j, m, query i), so that
    the reduction over j and both products read it as one matrix."""
    q, k, v, probs = primals
    m, heads, queries, width = grad.shape
    keys = k.shape[1]
    rows = grad.transpose(0, 1).reshape(heads, m * queries, width)
    d_probs_t = (v @ rows.mT).view(heads, keys, m, queries)
    d_scores_t = _softmax_tangent(d_probs_t, probs.mT[:, :, None, :], 1)
    d_q = (k.mT @ d_scores_t.view(heads, keys, m * queries)).view(heads, -1, m, queries)
    d_k = (d_scores_t.view(heads, keys * m, queries) @ q).view(heads, keys, m, -1)
    columns = grad.permute(1, 2, 0, 3).reshape(heads, queries, m * width)
    d_v = (probs.mT @ columns).view(heads, keys, m, width)
    return d_q.permute(2, 0, 3, 1), d_k.permute(2, 0, 1, 3), d_v.permute(2, 0, 1, 3)


class _Attention(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
        probs = (_flat(q) @ _flat(k).mT * scale).softmax(-1)
        return (probs @ _flat(v)).reshape(*q.shape[:-1], v.shape[-1]), probs

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        q, k, v, scale = inputs
        probs = output[1]
        ctx.mark_non_differentiable(probs)
        saved = (_flat(q) * scale, _flat(k) * scale, _flat(v), probs)
        ctx.save_for_forward(*saved)
        ctx.save_for_backward(*saved)
        ctx.shapes = (q.shape, k.shape, v.shape)

    @staticmethod
    def jvp(ctx, tq: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor, _scale: None):
        explicit = _explicit((tq, tk, tv), ctx.saved_tensors)
        out_shape = (*ctx.shapes[0][:-1], ctx.shapes[2][-1])
        if explicit is None:
            return _generic_jvp(ctx.saved_tensors, tq, tk, tv).reshape(out_shape), None
        directions, primals, levels = explicit
        with torch._C._DisableFuncTorch():  # plain tensors: no transform may rewrap them
            m = directions[0].shape[0]
            flat = [d.reshape(m, -1, *d.shape[-2:]) for d in directions]
            out = _attention_jvp(primals, flat).reshape(m, *out_shape)
        return levels.wrap(out), None

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _probs_grad: None):
        explicit = _explicit((grad,), ctx.saved_tensors)
        if explicit is None:
            grads = _generic_vjp(ctx.saved_tensors, grad)
            return *(g.reshape(s) for g, s in zip(grads, ctx.shapes, strict=True)), None
        (directions,), primals, levels = explicit
        with torch._C._DisableFuncTorch():  # plain tensors: no transform may rewrap them
            m = directions.shape[0]
            grads = _attention_vjp(primals, directions.reshape(m, -1, *directions.shape[-2:]))
            grads = [g.reshape(m, *s) for g, s in zip(grads, ctx.shapes, strict=True)]
        return *(levels.wrap(g) for g in grads), None


def _generic_jvp(saved: Sequence[torch.Tensor], tq, tk, tv) -> torch.Tensor:
    """The same JVP through torch's batching rules (a tangent nested deeper than the engine's)."""
    q, k, v, probs = saved
    d_scores = _flat(tq) @ k.mT + q @ _flat(tk).mT
    d_probs = _softmax_tangent(d_scores, probs, -1)
    return d_probs @ v + probs @ _flat(tv)


def _generic_vjp(saved: Sequence[torch.Tensor], grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v, probs = saved
    g = _flat(grad)
    d_scores = _softmax_tangent(g @ v.mT, probs, -1)
    return d_scores @ k, d_scores.mT @ q, probs.mT @ g


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T scale) v`` (no mask, dropout or causality), differentiated by q, k and
    v (:class:`_Attention`)."""
    return _Attention.apply(q, k, v, float(scale))[0]
