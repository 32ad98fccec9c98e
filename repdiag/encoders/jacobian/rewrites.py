"""What the engine runs its differentiated functions under: eval mode, frozen parameters, the
math attention kernel and a few ops rewritten into forms with forward-mode and batching rules
(:func:`jacobian_mode`, :class:`_JacobianRewrites`)."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from repdiag.encoders.jacobian import tangent_rules

SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
"""``scaled_dot_product_attention``'s positional arguments, in order."""


def _autocasting(device_type: str) -> bool:
    """Autocast is on for this device type (never on the meta device, which has none)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast
        return False


def _pair(value: Any) -> tuple[Any, Any]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _is_global(output_size: Any) -> bool:
    return all(size == 1 for size in _pair(output_size))


class _JacobianRewrites(TorchFunctionMode):
    """Run some ops of the differentiated function as the same maths in ops torch.func handles
    better (class switches ``patchify``, ``global_pool`` and ``tangent_rules``, all on; the
    benchmarks turn them off to measure the baseline):

    * ``linear`` and ``layer_norm`` with frozen parameters and plain attention, outside
      autocast, by their explicit tangent rules (:mod:`repdiag.encoders.jacobian.tangent_rules`):
      no tangents made for the constants, layer norm's derivative in four passes, attention's
      directions laid out by the rule (41% fewer bytes moved by the paper's ViT-L pass,
      ``benchmarks/bytes_moved.py --vit-l``).

    * patch-embedding convolutions (kernel = stride, no padding, dilation or groups) as the
      identical patches @ W^T product. oneDNN's CPU kernel for their input gradient under vmap is
      slow (157 ms vs 23 ms as a matmul for 192 cotangents of a 64 px, patch 8 ViT); the Jacobian
      of a ViT spends ~6% there otherwise. A matmul on a GPU too, where it is one GEMM.
    * global average pooling (``adaptive_avg_pool2d`` to 1 x 1, as timm's and torchvision's
      pooling layers call it) as ``mean`` over the two spatial dimensions. On a channels-last
      feature map (ConvNeXt's blocks end in a permute, GPUs run CNNs channels-last) the forward-mode
      derivative of ``adaptive_avg_pool2d`` calls ``as_strided_``, which has no batching rule: every
      vmapped JVP then loops over the directions one at a time (torch 2.14).

    Under autocast (``precision: bf16``) three more run as their decompositions, whose vmapped
    backward on bfloat16 CPU inputs otherwise fails (torch 2.14: "expected scalar type BFloat16
    but found Float"): attention (:func:`_attention`: matmuls in bfloat16, the softmax in
    float32, as the math SDPA kernel computes it) and eval-mode batch norm (:func:`_batch_norm`:
    the affine map of the running statistics, in float32) and layer norm (:func:`_layer_norm`,
    in float32; ConvNeXt's LayerNorm2d after a bfloat16 depthwise convolution).
    """

    patchify = True
    global_pool = True
    tangent_rules = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RULES and self.tangent_rules:
            rule = _rule_call(func, args, kwargs)
            if rule is not None:
                return rule
        if func is nn.functional.conv2d and self.patchify:
            names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
            call = {**dict(zip(names, args, strict=False)), **kwargs}
            if self._is_patchify(call):
                return self._as_matmul(call["input"], call["weight"], call.get("bias"))
        elif func is nn.functional.adaptive_avg_pool2d and self.global_pool:
            call = {**dict(zip(("input", "output_size"), args, strict=False)), **kwargs}
            x = call["input"]
            if isinstance(x, torch.Tensor) and x.ndim in (3, 4) and _is_global(call["output_size"]):
                return x.mean(dim=(-2, -1), keepdim=True)
        elif func is nn.functional.batch_norm:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training")
            call = {**dict(zip(names, args, strict=False)), **kwargs}
            x = call["input"]
            if (
                _autocasting(x.device.type)
                and not call.get("training", False)
                and call.get("running_mean") is not None
                and call.get("running_var") is not None
            ):
                eps = kwargs.get("eps", args[7] if len(args) > 7 else 1e-5)
                return _batch_norm(x, call, eps)
        elif func is nn.functional.layer_norm:
            names = ("input", "normalized_shape", "weight", "bias", "eps")
            call = {**dict(zip(names, args, strict=False)), **kwargs}
            if _autocasting(call["input"].device.type):
                return _layer_norm(**call)
        elif func is nn.functional.scaled_dot_product_attention:
            call = {**dict(zip(SDPA_ARGUMENTS, args, strict=False)), **kwargs}
            q = call["query"]
            if (
                _autocasting(q.device.type)
                and not call.get("dropout_p", 0.0)
                and not call.pop("enable_gqa", False)
            ):
                return _attention(**call)
        return func(*args, **kwargs)

    @staticmethod
    def _is_patchify(call: Mapping[str, Any]) -> bool:
        x, weight = call["input"], call["weight"]
        kernel = tuple(weight.shape[-2:])
        return (
            x.ndim == 4
            and _pair(call.get("stride", 1)) == kernel
            and call.get("padding", 0) in (0, (0, 0), [0, 0], "valid")
            and _pair(call.get("dilation", 1)) == (1, 1)
            and call.get("groups", 1) == 1
        )

    @staticmethod
    def _as_matmul(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        n, c, height, width = x.shape
        ph, pw = weight.shape[-2:]
        rows, cols = height // ph, width // pw
        patches = (
            x[..., : rows * ph, : cols * pw]
            .reshape(n, c, rows, ph, cols, pw)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(n, rows * cols, c * ph * pw)
        )
        y = patches @ weight.reshape(weight.shape[0], -1).T
        if bias is not None:
            y = y + bias
        return y.reshape(n, rows, cols, -1).permute(0, 3, 1, 2)


_RULES = {
    nn.functional.linear: (tangent_rules.linear, ("input", "weight", "bias")),
    nn.functional.layer_norm: (
        tangent_rules.layer_norm,
        ("input", "normalized_shape", "weight", "bias", "eps"),
    ),
    nn.functional.scaled_dot_product_attention: (tangent_rules.attention, ()),
}


def _attention_rule(call: Mapping[str, Any]) -> torch.Tensor | None:
    """Plain attention (no mask, dropout, causality or grouped heads; autocast off) by its
    tangent rule, else None. ``call``: the SDPA call's arguments by name."""
    query, key, value = call["query"], call["key"], call["value"]
    plain = call.get("attn_mask") is None and not call.get("dropout_p", 0.0)
    plain = plain and not call.get("is_causal", False) and not call.get("enable_gqa", False)
    if not plain or query.ndim < 3 or _autocasting(query.device.type):
        return None
    if key.shape[:-2] != query.shape[:-2] or value.shape[:-2] != query.shape[:-2]:
        return None
    scale = call.get("scale")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return tangent_rules.attention(query, key, value, scale)


def _rule_call(func: Any, args: tuple, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """``func`` by its explicit tangent rule (:mod:`.tangent_rules`) when its constants are
    frozen and autocast is off (autocast's own rewrites apply then), else None."""
    if func is nn.functional.scaled_dot_product_attention:
        return _attention_rule(dict(zip(SDPA_ARGUMENTS, args, strict=False)) | dict(kwargs))
    rule, names = _RULES[func]
    call = {"bias": None, "weight": None, "eps": 1e-5} | dict(zip(names, args, strict=False))
    call |= kwargs
    x = call["input"]
    frozen = all(
        not (isinstance(t, torch.Tensor) and t.requires_grad)
        for t in (call["weight"], call["bias"])
    )
    if not frozen or not isinstance(x, torch.Tensor) or _autocasting(x.device.type):
        return None
    return rule(*(call[name] for name in names))


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T scale + mask) v without dropout, the softmax in float32 (what the math SDPA
    kernel computes), in ops with autocast, forward-mode and batching rules."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale
    if is_causal:
        rows, cols = scores.shape[-2:]
        keep = torch.ones(rows, cols, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores.softmax(dim=-1).to(value.dtype) @ value


def _batch_norm(x: torch.Tensor, call: Mapping[str, Any], eps: float) -> torch.Tensor:
    """Eval-mode batch norm, (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1),
    in float32 or wider."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = torch.rsqrt(call["running_var"].to(dtype) + eps)
    if call.get("weight") is not None:
        scale = scale * call["weight"].to(dtype)
    y = (x.to(dtype) - call["running_mean"].to(dtype).reshape(shape)) * scale.reshape(shape)
    if call.get("bias") is not None:
        y = y + call["bias"].to(dtype).reshape(shape)
    return y


def _layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Layer norm, (x - mean) / sqrt(var + eps) * weight + bias over the last
    ``len(normalized_shape)`` dimensions (biased variance, as ``F.layer_norm``), in float32 or
    wider, as autocast runs ``layer_norm``."""
    dtype = torch.promote_types(input.dtype, torch.float32)
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    x = input.to(dtype)
    mean = x.mean(dim=dims, keepdim=True)
    var = (x - mean).square().mean(dim=dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y


@contextlib.contextmanager
def tangent_rules_set(on: bool) -> Iterator[None]:
    """Within the block the rewrites use the explicit tangent rules (``on``) or torch's own
    (the engine before :mod:`.tangent_rules`, which the benchmarks time beside it)."""
    saved = _JacobianRewrites.tangent_rules
    _JacobianRewrites.tangent_rules = on
    try:
        yield
    finally:
        _JacobianRewrites.tangent_rules = saved


@contextlib.contextmanager
def jacobian_mode(module: nn.Module | None, rewrites: bool = False) -> Iterator[None]:
    """Eval mode, frozen parameters, grad enabled, math attention for a block.

    The math SDPA kernel (and no nn.MultiheadAttention fast path) decomposes attention into ops
    that have forward-mode and batching rules; ``rewrites`` (used by the engine on every device)
    runs patch embeddings as matmuls and global average pooling as a mean
    (:class:`_JacobianRewrites`). Restores the module's training flag and ``requires_grad`` flags.
    """
    mha_fastpath = torch.backends.mha.get_fastpath_enabled()
    saved: list[tuple[nn.Parameter, bool]] = []
    training = module.training if module is not None else False
    try:
        if module is not None:
            module.eval()
            saved = [(p, p.requires_grad) for p in module.parameters()]
            for p, _ in saved:
                p.requires_grad_(False)
        torch.backends.mha.set_fastpath_enabled(False)
        rewrite = _JacobianRewrites() if rewrites else contextlib.nullcontext()
        with torch.enable_grad(), sdpa_kernel([SDPBackend.MATH]), warnings.catch_warnings():
            # torch scripts its forward-mode decompositions on first use, with a deprecation warning
            warnings.filterwarnings(
                "ignore", message=r".*torch\.jit\.script", category=FutureWarning
            )
            with rewrite:
                yield
    finally:
        torch.backends.mha.set_fastpath_enabled(mha_fastpath)
        for p, flag in saved:
            p.requires_grad_(flag)
        if module is not None:
            module.train(training)
