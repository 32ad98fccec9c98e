"""Per-layer Jacobian spectra of a vision encoder and the Jacobian effective rank (JER).

For an input x (a preprocessed image) and a readout r(x) in R^d (a layer tap), J(x) = dr/dx is a
d x d_in matrix. Its singular values s_1 >= s_2 >= ... describe how many input directions the
readout is sensitive to; the binding paper (Chung and Kim 2026, Eq. 1, Sec. 4.1) summarises them
by JER(x) = (sum_i s_i)^2 / sum_i s_i^2 over the top k = 32 singular values.

Two ways to get the spectrum, both batched over directions and images with ``torch.func``:

* ``exact``: all d rows of J by vmapped vector-Jacobian products (d VJPs), then ``svdvals``.
* ``randomized``: randomized subspace iteration (Halko, Martinsson and Tropp 2011, Alg. 4.4):
  Omega = QR of a seeded Gaussian d_in x k draw; Y = J Omega (k JVPs), then q rounds of
  Z = orth(J^T orth(Y)), Y = J Z; finally B = Q^T J (k VJPs) and s = svdvals(B). It costs
  k (2q + 2) products, so for a readout with d <= k (2q + 2) the exact top-k is cheaper and has no
  approximation error: ``auto`` picks per layer. A tap derived from an exact one (``final`` of a
  class-token ViT or of a ResNet, a projection ``head``) is exact too: its J is the small local
  Jacobian times the parent's, carried in the parent's d x d QR factor.

The initial J Omega for every randomized layer comes from one forward-mode pass (forward-mode
products give all layers at once); VJPs reuse one recorded forward per layer. Attention runs
through the math SDPA kernel, which has forward-mode and batching rules; patch embeddings run as
matmuls and global average pooling as a mean over the spatial dimensions (which, unlike
``adaptive_avg_pool2d`` on a channels-last feature map, has forward-mode batching rules).
``batch_size`` bounds the number of Jacobian-vector products evaluated together, hence memory.
``precision`` (``fp32``, ``tf32``, ``bf16``; :func:`repdiag.core.gpu.numerics`) sets TF32 and,
on CUDA, deterministic algorithms for the computation; ``bf16`` runs the model under bfloat16
autocast while the engine's own linear algebra (QR, SVD, the chain rule) stays in float32.

:func:`run_chunked` is the restartable driver used by the workflow: images are processed in
chunks whose results are cached (atomically) outside the declared output, so a killed job resumes
where it stopped and gives the same result as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from repdiag.core import gpu
from repdiag.core.errors import ConfigError
from repdiag.core.registry import Registry
from repdiag.core.runtime import Progress
from repdiag.core.store import atomic_path

log = logging.getLogger(__name__)

METHODS = ("auto", "exact", "randomized")
# Jacobian-vector products per pass when not given: on CPU small batches keep the backward's
# elementwise work in cache (measured fastest at 16-32 for a width-192 ViT); GPUs want large ones.
DEFAULT_BATCH_SIZE = {"cpu": 32, "cuda": 512}

# ----------------------------------------------------------------------------------------------
# JER formulas
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Readouts: an encoder's layer taps or a plain module's output
# ----------------------------------------------------------------------------------------------


class Readout:
    """``readout(x, layers) -> {layer: (N, d_layer)}`` for a model with taps or a plain callable.

    A model exposing ``layers`` (names in depth order) and ``layer_outputs(x, layers=...)`` is used
    as is; any other callable (e.g. an ``nn.Module``) has the single layer ``output`` (flattened).
    """

    def __init__(self, model: Any) -> None:
        self.derived: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {}
        self._autocast: Callable[[], contextlib.AbstractContextManager] | None = None
        if hasattr(model, "layers") and hasattr(model, "layer_outputs"):
            self.layers = [str(name) for name in model.layers]
            self._fn = model.layer_outputs
            module = getattr(model, "model", None)
            self.derived = dict(getattr(model, "derived_taps", None) or {})
        elif callable(model):
            self.layers = ["output"]
            self._fn = lambda x, layers=None: {"output": model(x)}
            module = model
        else:
            raise TypeError(
                f"jacobian_spectra needs an nn.Module, a callable or an object with `layers` and "
                f"`layer_outputs`; got {type(model).__name__}"
            )
        self.module = module if isinstance(module, nn.Module) else None

    def mixed_precision(self, precision: str, device: torch.device) -> None:
        """Run the model (and the derived taps' functions) under ``precision``'s autocast
        (:func:`repdiag.core.gpu.autocast`), readouts cast back to the input's dtype."""
        if precision == "bf16":
            self._autocast = lambda: gpu.autocast(precision, device)
            self.derived = {
                name: (parent, self._autocasting(fn)) for name, (parent, fn) in self.derived.items()
            }

    def _autocasting(
        self, fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(v: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                return fn(v).to(v.dtype)

        return run

    def check(self, layers: Sequence[str] | None) -> list[str]:
        """The requested layers in depth order (all when ``None``); unknown names are errors."""
        if layers is None:
            return list(self.layers)
        unknown = [name for name in layers if name not in self.layers]
        if unknown:
            raise ConfigError(f"unknown layers {unknown}; this model's taps are {self.layers}")
        return [name for name in self.layers if name in set(layers)]

    def chains(self, layers: Sequence[str]) -> dict[str, list[str]]:
        """``{root: [taps among layers derived from root, directly or through each other]}``.

        A derived tap ``c = fn(p)`` (row by row) has ``J_c = (d fn / d p) J_p``: one small
        Jacobian instead of ``d_c`` more passes back through the network.
        """
        wanted, root_of = set(layers), {}
        for name in layers:  # depth order: a parent comes before its children
            parent = self.derived.get(name, (None, None))[0]
            if parent in wanted:
                root_of[name] = root_of.get(parent, parent)
        chains: dict[str, list[str]] = {}
        for child, root in root_of.items():
            chains.setdefault(root, []).append(child)
        return chains

    def __call__(self, x: torch.Tensor, layers: Sequence[str]) -> dict[str, torch.Tensor]:
        if self._autocast is not None:
            with self._autocast():
                outputs = self._fn(x, layers=list(layers))
            outputs = {name: value.to(x.dtype) for name, value in outputs.items()}
        else:
            outputs = self._fn(x, layers=list(layers))
        missing = [name for name in layers if name not in outputs]
        if missing:
            raise ConfigError(f"layer_outputs did not return layers {missing}")
        return {name: outputs[name].reshape(outputs[name].shape[0], -1) for name in layers}


def _pair(value: Any) -> tuple[Any, Any]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _is_global(output_size: Any) -> bool:
    return all(size == 1 for size in _pair(output_size))


class _JacobianRewrites(TorchFunctionMode):
    """Run some ops of the differentiated function as the same maths in ops torch.func handles
    better (class switches ``patchify`` and ``global_pool``, both on; the benchmarks turn them off
    to measure the baseline):

    * patch-embedding convolutions (kernel = stride, no padding, dilation or groups) as the
      identical patches @ W^T product. oneDNN's CPU kernel for their input gradient under vmap is
      slow (157 ms vs 23 ms as a matmul for 192 cotangents of a 64 px, patch 8 ViT); the Jacobian
      of a ViT spends ~6% there otherwise. A matmul on a GPU too, where it is one GEMM.
    * global average pooling (``adaptive_avg_pool2d`` to 1 x 1, as timm's and torchvision's
      pooling layers call it) as ``mean`` over the two spatial dimensions. On a channels-last
      feature map (ConvNeXt's blocks end in a permute, GPUs run CNNs channels-last) the forward-mode
      derivative of ``adaptive_avg_pool2d`` calls ``as_strided_``, which has no batching rule: every
      vmapped JVP then loops over the directions one at a time (torch 2.14).

    Under autocast (``precision: bf16``) two more run as their decompositions, whose vmapped
    backward on bfloat16 CPU inputs otherwise fails (torch 2.14: "expected scalar type BFloat16
    but found Float"): attention (:func:`_attention`: matmuls in bfloat16, the softmax in
    float32, as the math SDPA kernel computes it) and eval-mode batch norm (:func:`_batch_norm`:
    the affine map of the running statistics, in float32).
    """

    patchify = True
    global_pool = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
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
                torch.is_autocast_enabled(x.device.type)
                and not call.get("training", False)
                and call.get("running_mean") is not None
                and call.get("running_var") is not None
            ):
                eps = kwargs.get("eps", args[7] if len(args) > 7 else 1e-5)
                return _batch_norm(x, call, eps)
        elif func is nn.functional.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            call = {**dict(zip(names, args, strict=False)), **kwargs}
            q = call["query"]
            if (
                torch.is_autocast_enabled(q.device.type)
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


@contextlib.contextmanager
def _jacobian_mode(module: nn.Module | None, rewrites: bool = False) -> Iterator[None]:
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


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


def choose_method(method: str, d_out: int, k: int, power_iters: int) -> str:
    """``auto``: exact when the readout is narrow, d_out <= k (2q + 2), else randomized."""
    if method not in METHODS:
        raise ConfigError(f"unknown Jacobian method {method!r}; choose one of {list(METHODS)}")
    if method != "auto":
        return method
    return "exact" if d_out <= k * (2 * power_iters + 2) else "randomized"


def _methods(
    readout: Readout,
    layers: Sequence[str],
    method: str,
    d_out: Mapping[str, int],
    k: int,
    power_iters: int,
) -> dict[str, str]:
    """:func:`choose_method` per layer, except that under ``auto`` a tap derived from an exact
    tap is exact too: its Jacobian costs one small local Jacobian, not d passes through the net."""
    methods: dict[str, str] = {}
    for name in layers:  # depth order: a parent comes before its children
        parent = readout.derived.get(name, (None, None))[0]
        if method == "auto" and methods.get(parent) == "exact":
            methods[name] = "exact"
        else:
            methods[name] = choose_method(method, d_out[name], k, power_iters)
    return methods


def input_directions(d_in: int, k: int, seed: int) -> torch.Tensor:
    """k orthonormal input directions (k, d_in): QR of a seeded standard Gaussian draw (float64)."""
    generator = torch.Generator().manual_seed(int(seed))
    draw = torch.randn(d_in, k, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(draw)
    return q.T.contiguous()


def _orthonormal(vectors: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (m', n, D) of each image's span of ``vectors`` (m, n, D), m' = min(m, D)."""
    q, _ = torch.linalg.qr(vectors.permute(1, 2, 0))
    return q.permute(2, 0, 1)


def _layer_fn(readout: Readout, layer: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: readout(x, (layer,))[layer]


def _vjps(vjp_fn: Callable, cotangents: torch.Tensor, chunk: int) -> torch.Tensor:
    """J^T u for each cotangent u (m, n, d) -> (m, n, d_in), ``chunk`` directions at a time."""
    grads = torch.func.vmap(vjp_fn, chunk_size=chunk)(cotangents)[0]
    return grads.reshape(grads.shape[0], grads.shape[1], -1)


def _jvps(
    readout: Readout, layers: Sequence[str], x: torch.Tensor, tangents: torch.Tensor, chunk: int
) -> dict[str, torch.Tensor]:
    """J_l v for each tangent v (m, n, d_in) and every layer l in one forward-mode pass: (m, n, d_l)."""
    tangents = tangents.reshape(tangents.shape[0], *x.shape)

    def push(tangent: torch.Tensor) -> dict[str, torch.Tensor]:
        return torch.func.jvp(lambda inp: readout(inp, layers), (x,), (tangent,))[1]

    return torch.func.vmap(push, chunk_size=chunk)(tangents)


def _exact_spectra(
    readout: Readout, layer: str, derived: Sequence[str], x: torch.Tensor, batch_size: int
) -> dict[str, torch.Tensor]:
    """All singular values (n, min(d, d_in)) of J for ``layer`` (d one-hot cotangents through
    vmapped VJPs) and for the taps ``derived`` from it (chain rule, see :meth:`Readout.chains`).

    A tap's rows are kept only until its last derived tap has used them.
    """
    y, vjp_fn = torch.func.vjp(_layer_fn(readout, layer), x)
    n, d = y.shape
    eye = torch.eye(d, dtype=y.dtype, device=y.device)
    jac = _vjps(vjp_fn, eye[:, None, :].expand(d, n, d), max(1, batch_size // n)).transpose(0, 1)
    d_in = jac.shape[-1]
    r_factor = _r_factor(jac)
    spectra = {layer: torch.linalg.svdvals(jac if r_factor is None else r_factor)}
    if not derived:
        return spectra
    # J = R^T Q^T with orthonormal Q, so a derived tap's L J = (L R^T) Q^T has the singular values
    # of L R^T (d_c x d): its chain is carried in the d-wide factor, never in the d_in-wide rows.
    rows = {layer: jac if r_factor is None else r_factor.transpose(-2, -1)}
    del jac
    values = {layer: y}
    uses = {name: 0 for name in (layer, *derived)}
    for child in derived:
        uses[readout.derived[child][0]] += 1
    for name in derived:
        parent, fn = readout.derived[name]
        values[name], local = _row_jacobians(fn, values[parent])
        rows[name] = local @ rows[parent]
        uses[parent] -= 1
        if not uses[parent]:
            del rows[parent]
        s = _svdvals(rows[name])
        rank = min(rows[name].shape[-2], d_in)  # the values the factor cannot carry are zeros
        spectra[name] = nn.functional.pad(s, (0, rank - s.shape[-1]))
        if not uses[name]:
            del rows[name]
    return spectra


def _r_factor(matrices: torch.Tensor) -> torch.Tensor | None:
    """R of M^T = QR (r x r) for wide (r, c) matrices (c > 2r), else ``None``: same singular values
    as M from one Householder QR instead of a wide SVD (4x faster on CPU)."""
    r, c = matrices.shape[-2:]
    if c > 2 * r:
        return torch.linalg.qr(matrices.transpose(-2, -1), mode="r")[1]
    return None


def _row_jacobians(
    fn: Callable[[torch.Tensor], torch.Tensor], v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(v)`` (n, d_out) and its Jacobian for each row of ``v``: (n, d_out, d_in)."""
    local = torch.func.vmap(torch.func.jacrev(lambda row: fn(row[None])[0]))(v)
    return fn(v), local


def _svdvals(matrices: torch.Tensor) -> torch.Tensor:
    """Singular values of each (r, c) matrix (through :func:`_r_factor` when wide)."""
    r_factor = _r_factor(matrices)
    return torch.linalg.svdvals(matrices if r_factor is None else r_factor)


def _randomized_spectra(
    readout: Readout,
    layers: Sequence[str],
    x: torch.Tensor,
    omega: torch.Tensor,
    power_iters: int,
    batch_size: int,
) -> dict[str, torch.Tensor]:
    """Top-k singular values (n, k) of each layer's J by randomized subspace iteration."""
    n, k = x.shape[0], omega.shape[0]
    chunk = max(1, batch_size // n)
    start = omega[:, None, :].expand(k, n, omega.shape[1])
    sketches = _jvps(readout, layers, x, start, chunk)
    spectra = {}
    for layer in layers:
        _, vjp_fn = torch.func.vjp(_layer_fn(readout, layer), x)
        q = _orthonormal(sketches.pop(layer))
        for _ in range(power_iters):
            z = _orthonormal(_vjps(vjp_fn, q, chunk))
            q = _orthonormal(_jvps(readout, (layer,), x, z, chunk)[layer])
        b = _vjps(vjp_fn, q, chunk).transpose(0, 1)
        s = _svdvals(b)
        spectra[layer] = nn.functional.pad(s, (0, k - s.shape[1]))
    return spectra


class Spectra(dict):
    """``{layer: singular values (n_images, rank)}`` plus ``methods`` {layer: method used},
    ``d_out`` {layer: readout width}, ``d_in`` (input dimension) and, from the engine,
    ``numerics`` (:func:`repdiag.core.gpu.numerics`' record)."""

    methods: dict[str, str]
    d_out: dict[str, int]
    d_in: int
    numerics: dict[str, Any] | None = None


def _module_dtype_device(
    module: nn.Module | None,
) -> tuple[torch.dtype | None, torch.device | None]:
    if module is None:
        return None, None
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype, tensor.device
    return None, None


def _output_dims(readout: Readout, layers: Sequence[str], x: torch.Tensor) -> dict[str, int]:
    with torch.no_grad():
        outputs = readout(x[:1], layers)
    return {name: int(outputs[name].shape[1]) for name in layers}


def jacobian_spectra(
    model: Any,
    images: torch.Tensor | np.ndarray,
    layers: Sequence[str] | None = None,
    method: str = "auto",
    k: int = 32,
    power_iters: int = 5,
    seed: int = 0,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    precision: str = "fp32",
) -> Spectra:
    """Singular values of J(x) = d readout / d x for each image and layer, sorted descending.

    ``model``: an ``nn.Module`` (one layer, ``output``) or an encoder with ``layers`` and
    ``layer_outputs(x, layers=...)``; ``images``: preprocessed inputs (N, ...). ``layers``: the
    taps to differentiate (default all). ``method``: ``exact`` (all min(d, d_in) values),
    ``randomized`` (top k by Halko et al.'s subspace iteration with ``power_iters`` rounds and
    seeded directions) or ``auto`` (exact when d <= k(2q+2), per layer; see ``.methods``).
    ``batch_size``: Jacobian-vector products evaluated together (bounds memory; default 32 on
    CPU, 512 on GPU).
    ``device``: where to compute (moves the model there); default: the model's device.
    ``precision``: ``fp32`` (full float32: no TF32; the default), ``tf32`` (TF32 matmuls and
    cuDNN convolutions on CUDA; on CPU the same as ``fp32``) or ``bf16`` (the model under
    bfloat16 autocast); set with deterministic algorithms on CUDA by
    :func:`repdiag.core.gpu.numerics`, whose record is ``.numerics``.
    Returns a :class:`Spectra` dict of CPU tensors (n_images, rank).
    """
    if k < 1 or power_iters < 0:
        raise ConfigError(
            f"k must be >= 1 and power_iters >= 0 (got k={k}, power_iters={power_iters})"
        )
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1 (got {batch_size})")
    readout = Readout(model)
    layers = readout.check(layers)
    dtype, model_device = _module_dtype_device(readout.module)
    if device is not None:
        model_device = torch.device(device)
        if readout.module is not None:
            readout.module.to(model_device)
    x_all = torch.as_tensor(images)
    if dtype is None:
        dtype = x_all.dtype if x_all.is_floating_point() else torch.get_default_dtype()
    x_all = x_all.to(device=model_device or x_all.device, dtype=dtype)
    if x_all.ndim < 2 or x_all.shape[0] == 0:
        raise ConfigError(
            f"images must be a non-empty batch (N, ...); got shape {tuple(x_all.shape)}"
        )
    d_in = math.prod(x_all.shape[1:])
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE["cuda" if x_all.device.type == "cuda" else "cpu"]
    readout.mixed_precision(precision, x_all.device)
    with (
        gpu.numerics(precision, x_all.device) as record,
        _jacobian_mode(readout.module, rewrites=True),
    ):
        d_out = _output_dims(readout, layers, x_all)
        methods = _methods(readout, layers, method, d_out, k, power_iters)
        spectra = _exact_all(readout, methods, d_out, x_all, batch_size)
        randomized = [name for name in layers if methods[name] == "randomized"]
        if randomized:
            omega = input_directions(d_in, k, seed).to(x_all)
            spectra.update(
                _randomized_all(readout, randomized, x_all, omega, power_iters, batch_size)
            )
    result = Spectra((name, spectra[name]) for name in layers)
    result.methods, result.d_out, result.d_in = methods, d_out, d_in
    result.numerics = record
    return result


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _exact_all(
    readout: Readout,
    methods: Mapping[str, str],
    d_out: Mapping[str, int],
    x_all: torch.Tensor,
    batch_size: int,
) -> dict[str, torch.Tensor]:
    exact = [name for name, chosen in methods.items() if chosen == "exact"]
    chains = readout.chains(exact)
    followers = {child for children in chains.values() for child in children}
    spectra = {}
    for name in exact:
        if name in followers:
            continue
        chain = chains.get(name, [])
        per_pass = max(1, batch_size // max(d_out[tap] for tap in (name, *chain)))
        parts: dict[str, list[torch.Tensor]] = {}
        for rows in _batches(len(x_all), per_pass):
            for tap, values in _exact_spectra(
                readout, name, chain, x_all[rows], batch_size
            ).items():
                parts.setdefault(tap, []).append(values.cpu())
        spectra.update({tap: torch.cat(values) for tap, values in parts.items()})
    return spectra


def _randomized_all(
    readout: Readout,
    layers: Sequence[str],
    x_all: torch.Tensor,
    omega: torch.Tensor,
    power_iters: int,
    batch_size: int,
) -> dict[str, torch.Tensor]:
    per_pass = max(1, batch_size // omega.shape[0])
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    for rows in _batches(len(x_all), per_pass):
        for name, s in _randomized_spectra(
            readout, layers, x_all[rows], omega, power_iters, batch_size
        ).items():
            parts[name].append(s.cpu())
    return {name: torch.cat(chunks) for name, chunks in parts.items()}


# ----------------------------------------------------------------------------------------------
# Restartable chunked driver
# ----------------------------------------------------------------------------------------------


def _digest_update(digest: Any, tensor: torch.Tensor) -> None:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes."""
    digest = hashlib.sha256()
    _digest_update(digest, torch.as_tensor(tensor))
    return digest.hexdigest()


def model_fingerprint(model: Any) -> str:
    """sha256 of every parameter and buffer (names, dtypes, shapes, values) of the model's module."""
    module = Readout(model).module
    digest = hashlib.sha256(type(model).__qualname__.encode())
    if module is not None:
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            _digest_update(digest, tensor)
    return digest.hexdigest()


def cache_key(settings: Mapping[str, Any], model_digest: str, images_digest: str) -> str:
    """Name of the cache folder: a hash of everything that determines the spectra, bit for bit.

    That includes torch's intra-op thread count: CPU reductions are split by thread, so spectra
    computed with another ``--cores`` differ in the last bits and must not be mixed in one store.
    """
    payload = json.dumps(
        {
            "settings": settings,
            "model": model_digest,
            "images": images_digest,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _save_chunk(path: Path, spectra: Spectra, n_images: int) -> None:
    meta = {
        "methods": spectra.methods,
        "d_out": spectra.d_out,
        "d_in": spectra.d_in,
        "n": n_images,
        "threads": torch.get_num_threads(),
    }
    arrays = {f"s__{name}": values.numpy() for name, values in spectra.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, meta=np.array(json.dumps(meta)), **arrays)


def _load_chunk(path: Path, layers: Sequence[str], n_images: int) -> Spectra | None:
    """A cached chunk, or None when it is absent or unusable (then it is recomputed).

    Any failure to read it (a cut or corrupt zip, bad JSON, a missing key, wrong dtype) counts
    as missing: the chunk is logged by name and recomputed, never a stuck run.
    """
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            spectra = Spectra((name, torch.from_numpy(data[f"s__{name}"])) for name in layers)
        methods = {name: str(meta["methods"][name]) for name in layers}
        d_out = {name: int(meta["d_out"][name]) for name in layers}
        d_in, n, threads = int(meta["d_in"]), int(meta["n"]), meta.get("threads")
    except Exception as err:  # zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, ...
        log.warning(
            "ignoring unreadable cached chunk %s (%s: %s); recomputing it",
            path.name,
            type(err).__name__,
            err,
        )
        return None
    if n != n_images or any(len(values) != n_images for values in spectra.values()):
        log.warning("ignoring cached chunk %s: it holds another number of images", path.name)
        return None
    if threads != torch.get_num_threads():
        log.warning(
            "ignoring cached chunk %s: computed with %s threads, this run has %d (results "
            "differ in the last bits across thread counts); recomputing it",
            path.name,
            threads,
            torch.get_num_threads(),
        )
        return None
    spectra.methods, spectra.d_out, spectra.d_in = methods, d_out, d_in
    return spectra


def _merge(chunks: Sequence[Spectra]) -> Spectra:
    first = chunks[0]
    merged = Spectra((name, torch.cat([chunk[name] for chunk in chunks])) for name in first)
    merged.methods, merged.d_out, merged.d_in = first.methods, first.d_out, first.d_in
    return merged


def run_chunked(
    model: Any,
    images: torch.Tensor,
    cache_dir: str | Path,
    *,
    chunk_size: int = 8,
    layers: Sequence[str] | None = None,
    label: str = "Jacobian spectra",
    **engine: Any,
) -> Spectra:
    """:func:`jacobian_spectra` over chunks of ``chunk_size`` images, each cached in ``cache_dir``.

    A finished chunk is written atomically to ``cache_dir/chunk_XXXX.npz`` and reused by a later
    call, so a killed run resumes with the missing chunks only. Chunks do not depend on each other
    (same directions for every image), so the result equals an uninterrupted run bit for bit.
    ``cache_dir`` must be specific to the model, images and settings (see :func:`cache_key`).
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1 (got {chunk_size})")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    layers = Readout(model).check(layers)
    n_total = len(images)
    progress = Progress(n_total, label)
    chunks, reused = [], 0
    for index, start in enumerate(range(0, n_total, chunk_size)):
        part = images[start : start + chunk_size]
        path = cache_dir / f"chunk_{index:04d}.npz"
        spectra = _load_chunk(path, layers, len(part))
        if spectra is None:
            spectra = jacobian_spectra(model, part, layers=layers, **engine)
            _save_chunk(path, spectra, len(part))
        else:
            reused += 1
        chunks.append(spectra)
        progress.update(len(part))
    if reused:
        log.info("%s: reused %d cached chunks of %d from %s", label, reused, len(chunks), cache_dir)
    return _merge(chunks)
