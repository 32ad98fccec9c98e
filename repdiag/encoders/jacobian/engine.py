"""Per-layer Jacobian spectra of a vision encoder.

For an input x (a preprocessed image) and a readout r(x) in R^d (a layer tap), J(x) = dr/dx is a
d x d_in matrix. Its singular values s_1 >= s_2 >= ... describe how many input directions the
readout is sensitive to; the binding paper (Chung and Kim 2026, Eq. 1, Sec. 4.1) summarises them
by JER(x) = (sum_i s_i)^2 / sum_i s_i^2 over the top k singular values (:mod:`.jer`; k is
``jacobians.k`` of the config, whose default is the paper's).

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
``adaptive_avg_pool2d`` on a channels-last feature map, has forward-mode batching rules;
:mod:`.rewrites`). ``batch_size`` bounds the number of Jacobian-vector products evaluated
together, hence memory. ``precision`` (``fp32``, ``tf32``, ``bf16``;
:func:`repdiag.core.gpu.numerics`) sets TF32 and, on CUDA, deterministic algorithms for the
computation; ``bf16`` runs the model under bfloat16 autocast while the engine's own linear algebra
(QR, SVD, the chain rule) stays in float32.

The settings (``method``, ``k``, ``power_iters``, ``seed``, ``precision``) have no defaults here:
they come from the ``jacobians`` config (:meth:`.options.JacobianSettings.engine`), whose
defaults are the schema's. :func:`.cache.run_chunked` is the restartable driver of the workflow.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from repdiag.core import gpu
from repdiag.core.errors import ConfigError
from repdiag.encoders.jacobian.rewrites import jacobian_mode

METHODS = ("auto", "exact", "randomized")
# Jacobian-vector products per pass when not given: on CPU small batches keep the backward's
# elementwise work in cache (measured fastest at 16-32 for a width-192 ViT); GPUs want large ones.
DEFAULT_BATCH_SIZE = {"cpu": 32, "cuda": 512}


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


def layer_methods(
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
        values[name], local = row_jacobians(fn, values[parent])
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


def row_jacobians(
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
    ``d_out`` {layer: readout width}, ``d_in`` (input dimension), ``batch_size`` and
    ``pass_sizing`` (from :func:`.cache.run_chunked`: the products per pass of its last call,
    and how every pass was sized) and, from the engine, ``numerics``
    (:func:`repdiag.core.gpu.numerics`' record)."""

    methods: dict[str, str]
    d_out: dict[str, int]
    d_in: int
    numerics: dict[str, Any] | None = None
    batch_size: int | None = None  # products per pass, set by cache.run_chunked
    pass_sizing: dict[str, Any] | None = None  # cache.PassSizes' record


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
    *,
    method: str,
    k: int,
    power_iters: int,
    seed: int,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    precision: str,
) -> Spectra:
    """Singular values of J(x) = d readout / d x for each image and layer, sorted descending.

    ``model``: an ``nn.Module`` (one layer, ``output``) or an encoder with ``layers`` and
    ``layer_outputs(x, layers=...)``; ``images``: preprocessed inputs (N, ...). ``layers``: the
    taps to differentiate (default all). ``method``: ``exact`` (all min(d, d_in) values),
    ``randomized`` (top k by Halko et al.'s subspace iteration with ``power_iters`` rounds and
    directions seeded by ``seed``) or ``auto`` (exact when d <= k(2q+2), per layer; see
    ``.methods``). ``batch_size``: Jacobian-vector products evaluated together (bounds memory;
    ``None``: :data:`DEFAULT_BATCH_SIZE` of the device).
    ``device``: where to compute (moves the model there); default: the model's device.
    ``precision``: ``fp32`` (full float32: no TF32), ``tf32`` (TF32 matmuls and
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
        jacobian_mode(readout.module, rewrites=True),
    ):
        d_out = _output_dims(readout, layers, x_all)
        methods = layer_methods(readout, layers, method, d_out, k, power_iters)
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
