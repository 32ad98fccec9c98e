"""Cost planner of the Jacobian stage: ``repdiag plan <config>``, offline and without weights.

Every model of the config is built with random weights on the ``meta`` device (shapes, no data,
no memory) and the unit costs of one probe image are counted there with
:class:`torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions, attention; 2 FLOPs per
multiply-add): for each tap l, ``fwd_l`` (a forward pass up to l), ``vjp_l`` (one vector-Jacobian
product, input gradient only: the parameters are frozen), ``jvp_l`` (one more direction of a
vmapped Jacobian-vector product) and ``call_l`` (the rest of one vmapped JVP call: the primal
forward, and the primal times the parameters' zero tangents that functorch also multiplies, about
one more forward). A network that is a stem, consecutive blocks and a tail is counted piecewise,
each distinct block once (:class:`TapUnits`). The units are combined with the engine's algorithm
(:mod:`repdiag.binding.jacobian`: methods per tap by its ``_methods``, chains by
:meth:`Readout.chains`), per image, with k directions, q power iterations, n images per pass and
c = ceil(k / chunk) vmap calls of ``chunk = max(1, batch // n)`` directions:

* exact tap l (a root): ``d_l`` VJPs, ``fwd_l + d_l vjp_l`` FLOPs;
* tap t derived from an exact tap p (chain rule, no product through the network): the counted
  row Jacobian of its small function plus ``2 d_t d_p w`` for ``local @ rows_p``, where
  ``w = d_root`` when the root's rows are carried in their R factor (``d_in > 2 d_root``), else
  ``d_in``;
* the shared sketch J Omega of the randomized taps R: k JVPs, ``c call_R + k jvp_R``;
* randomized tap l: ``q k`` JVPs and ``(q + 1) k`` VJPs,
  ``fwd_l + q (c call_l + k jvp_l) + (q + 1) k vjp_l``; with the sketch, k (2q + 2) products,
  the figure ``auto`` compares with d_l;
* ``(d_out)``: the engine's forward of every tap on one image per call (chunk_size images).

QR and SVD are not counted by FlopCounterMode; their FLOPs are given apart (``linalg``) from the
textbook counts of Householder QR (``2 m n^2 - 2 n^3 / 3`` for R, twice that with Q) and
values-only SVD (``4 m n^2 - 4 n^3 / 3``), m >= n.

Memory per pass (an estimate): ``P + n A_l + p G_l + rows``, with P the parameters and buffers,
A_l the bytes one image's forward keeps for the backward, G_l the peak extra bytes of one VJP
(both measured on meta by tracking live tensors, :class:`LiveBytes`), p = min(chunk, directions) n
products in flight and rows the Jacobian rows (exact: ``n d_l d_in``) or directions (randomized:
``n k (d_in + d_l)``) kept, in the model's dtype. The time is the total (linalg included) over a
FLOP rate: by default the float32 matmul rate measured here; a lower bound, since real kernels
reach a fraction of peak.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from repdiag.binding.jacobian import (
    DEFAULT_BATCH_SIZE,
    Readout,
    _jacobian_mode,
    _methods,
    _row_jacobians,
)
from repdiag.binding.jacobian_options import probe_counts
from repdiag.core.errors import RepdiagError

META = torch.device("meta")

# torch.hub entry points whose architecture is known without the local checkout (its hubconf.py),
# from the hubconf.py of facebookresearch/barlowtwins, swav, dino and vicreg: torchvision's
# resnet50 (the Barlow Twins and SwAV checkpoints have no fc, so ``strict: false`` removes it;
# DINO sets fc = Identity; VICReg's own ResNet-50 has none and pads 1 + 2 where torchvision pads
# 3: the same convolutions), and VICReg's ResNet-50 x2, every width doubled (``widen=2``).
HUB_ARCHITECTURES: dict[str, str] = {
    "resnet50": "torchvision resnet50 without fc",
    "dino_resnet50": "torchvision resnet50 without fc",
    "resnet50w2": "ResNet-50 with every width doubled (VICReg widen=2), no fc",
    "resnet50x2": "ResNet-50 with every width doubled (VICReg widen=2), no fc; "
    "facebookresearch/vicreg's hubconf.py calls it resnet50w2",
}


# ----------------------------------------------------------------------------------------------
# Plan records
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TapCost:
    """Per probe image: products through the network, counted and linear-algebra FLOPs; memory
    of one pass in bytes. ``method``: exact, randomized, chain (exact, derived from ``parent``)
    or sketch (the shared J Omega of the randomized taps)."""

    name: str
    method: str
    d_out: int
    jvps: int
    vjps: int
    flops: float
    linalg_flops: float
    memory_bytes: float
    parent: str | None = None

    @property
    def products(self) -> int:
        return self.jvps + self.vjps


@dataclasses.dataclass
class ModelPlan:
    """One model: its taps' costs per image and the number of probe images."""

    key: str
    kind: str
    input_shape: tuple[int, ...]
    taps: list[TapCost]
    images: int
    param_bytes: int

    @property
    def flops_per_image(self) -> float:
        return sum(tap.flops for tap in self.taps)

    @property
    def linalg_per_image(self) -> float:
        return sum(tap.linalg_flops for tap in self.taps)

    @property
    def products_per_image(self) -> int:
        return sum(tap.products for tap in self.taps)

    @property
    def peak_memory_bytes(self) -> float:
        return max((tap.memory_bytes for tap in self.taps), default=0.0)

    @property
    def total_flops(self) -> float:
        return (self.flops_per_image + self.linalg_per_image) * self.images


@dataclasses.dataclass
class Plan:
    """Every planned model, the ones left out (``{key: why}``) and the settings used."""

    models: list[ModelPlan]
    skipped: dict[str, str]
    settings: dict[str, Any]
    rate: float
    rate_source: str

    @property
    def total_flops(self) -> float:
        return sum(model.total_flops for model in self.models)

    @property
    def seconds(self) -> float:
        return self.total_flops / self.rate


# ----------------------------------------------------------------------------------------------
# Counting on the meta device
# ----------------------------------------------------------------------------------------------


class _GlobalOnly:
    """Stands in for FlopCounterMode's module tracker: every FLOP counts under ``Global``."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode (same registry and decompositions) without per-module attribution:
    its module tracker's backward hooks break ``torch.func.vjp`` under ``vmap`` (autograd.grad
    on a leaf), and it costs time."""
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _GlobalOnly()
    return counter


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs FlopCounterMode counts while ``fn()`` runs (2 per multiply-add of mm/conv/attention)."""
    with flop_counter() as counter:
        fn()
    return int(counter.get_total_flops())


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors that ops create and that are still alive, and their peak.

    Views and in-place results share their input's storage and are not counted; a tensor is
    freed when its TensorImpl dies (autograd's saved tensors keep theirs alive).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.is_mutable:
            return out
        inputs = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and id(tensor) not in inputs:
                size = tensor.numel() * tensor.element_size()
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._free, size)
        return out

    def _free(self, size: int) -> None:
        self.live -= size

    def reset_peak(self) -> None:
        self.peak = self.live


@dataclasses.dataclass
class Units:
    """Counted FLOPs of one image: ``fwd`` (the forward pass), ``vjp`` (one VJP's backward),
    ``jvp`` (one more direction of a vmapped JVP) and ``jvp_call`` (the rest of a vmapped JVP
    call: the primal forward and the products of the primal with the parameters' zero tangents,
    done once per call); ``saved``: bytes the forward keeps for the backward; ``peak``: extra
    bytes at the peak of one VJP. Parts of a network add up."""

    fwd: float = 0.0
    vjp: float = 0.0
    jvp: float = 0.0
    jvp_call: float = 0.0
    saved: float = 0.0
    peak: float = 0.0

    def __add__(self, other: Units) -> Units:
        return Units(
            self.fwd + other.fwd,
            self.vjp + other.vjp,
            self.jvp + other.jvp,
            self.jvp_call + other.jvp_call,
            self.saved + other.saved,
            max(self.peak, other.peak),
        )


def _output(value: Any) -> torch.Tensor:
    if isinstance(value, Mapping):
        value = list(value.values())[-1]
    return value[0] if isinstance(value, (tuple, list)) else value


def measure(fn: Callable[[torch.Tensor], Any], inp: torch.Tensor, jvp: bool = True) -> Units:
    """:class:`Units` of ``fn`` at ``inp`` (a batch of one): a counted forward, one counted VJP
    (cotangent of ones on the output) under :class:`LiveBytes`, and vmapped JVPs of one and two
    directions (the engine's ``vmap(jvp)``): ``jvp`` = T(2) - T(1), ``jvp_call`` = T(1) - jvp."""
    fwd = count_flops(lambda: fn(inp))
    leaf = inp.detach().requires_grad_(True)
    tracker = LiveBytes()
    with tracker:
        y = _output(fn(leaf))
        saved = tracker.live
        cotangent = torch.ones_like(y)
        tracker.reset_peak()
        with flop_counter() as counter:
            torch.autograd.grad(y, leaf, cotangent, allow_unused=True)
        peak = tracker.peak - saved
    del y
    per, call = 0, 0
    if jvp:

        def push(tangent: torch.Tensor) -> torch.Tensor:
            return torch.func.jvp(lambda i: _output(fn(i)), (inp,), (tangent,))[1]

        try:
            with warnings.catch_warnings():  # batching-rule fallbacks: slow on data, not on meta
                warnings.filterwarnings(
                    "ignore", message=".*performance drop", category=UserWarning
                )
                one, two = (
                    count_flops(lambda m=m: torch.func.vmap(push)(inp.new_zeros((m, *inp.shape))))
                    for m in (1, 2)
                )
            per, call = two - one, 2 * one - two
        except NotImplementedError:  # an op without forward-mode AD: no JVP (exact taps need none)
            per = call = math.nan
    return Units(float(fwd), float(counter.get_total_flops()), float(per), float(call), saved, peak)


class _Stop(Exception):
    """Raised by a hook to end a forward pass early."""


def _first_of(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value


class TapUnits:
    """:class:`Units` of every tap of a model, and of a set of taps run in one pass.

    With a tap plan whose blocks follow each other directly (each block's input is the previous
    block's output), the network is measured piecewise: the stem (up to the first block), each
    distinct block once (identical blocks at identical shapes cost the same), the deepest block
    as a tap (its pooled shortcut when it has one) and what follows the last block (``final``,
    ``head``); a tap's units are the sum of its pieces. Otherwise each tap is measured whole.
    """

    def __init__(self, model: Any, readout: Readout, x: torch.Tensor) -> None:
        self.readout, self.x = readout, x
        plan = getattr(model, "plan", None)
        self.blocks = list(getattr(plan, "blocks", None) or [])
        self.plan = plan
        self.whole: dict[tuple[str, ...], Units] = {}
        self.pieces: dict[str, Units] | None = None
        if self.blocks:
            try:
                self.pieces = self._pieces()
            except _NotPiecewise:
                self.pieces = None

    def _pieces(self) -> dict[str, Units]:
        calls: dict[str, tuple[tuple, dict]] = {}
        outputs: dict[str, Any] = {}
        handles = []
        for tap in self.blocks:

            def grab(module, args, kwargs, name=tap.name):
                calls[name] = (args, kwargs)

            def keep(module, args, output, name=tap.name):
                outputs[name] = output

            handles.append(tap.module.register_forward_pre_hook(grab, with_kwargs=True))
            handles.append(tap.module.register_forward_hook(keep))
        try:
            with torch.no_grad():
                self.plan.run(self.x, self.plan.has_head)
        finally:
            for handle in handles:
                handle.remove()
        names = [tap.name for tap in self.blocks]
        if set(calls) != set(names) or any(
            calls[b][0][0] is not _first_of(outputs[a]) for a, b in itertools.pairwise(names)
        ):
            raise _NotPiecewise
        self.calls, self.outputs = calls, outputs
        cache: dict[Any, Units] = {}
        pieces = {"(stem)": measure(self._stem, self.x)}
        for tap in self.blocks:
            args, kwargs = calls[tap.name]
            h, rest = args[0], args[1:]
            shapes = tuple(
                (tuple(t.shape), str(t.dtype))
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            )
            signature = (str(tap.module), shapes, tuple(sorted(kwargs)))

            def block(i, module=tap.module, rest=rest, kwargs=kwargs):
                return _first_of(module(i, *rest, **kwargs))

            def as_tap(i, tap=tap, rest=rest, kwargs=kwargs):
                if tap.pooled_forward is not None:
                    return tap.pooled_forward(tap.module, i)
                return tap.pool(tap.module(i, *rest, **kwargs))

            for kind, fn in (("block", block), ("tap", as_tap)):
                if kind == "tap" and tap.pooled_forward is None:  # pooling counts no FLOPs
                    pieces[f"tap:{tap.name}"] = pieces[f"block:{tap.name}"]
                    continue
                key = (kind, tap.pooled_forward is not None, signature)
                if key not in cache:
                    cache[key] = measure(fn, h.detach())
                pieces[f"{kind}:{tap.name}"] = cache[key]
        return pieces

    def _stem(self, inp: torch.Tensor) -> torch.Tensor:
        """The first block's input, as a function of the image."""
        box: dict[str, torch.Tensor] = {}

        def grab(module, args, kwargs):
            box["h"] = args[0]
            raise _Stop

        handle = self.blocks[0].module.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            self.plan.run(inp, False)
        except _Stop:
            pass
        finally:
            handle.remove()
        return box["h"]

    def _prefix(self, index: int) -> Units:
        """Stem + blocks before ``index``."""
        total = self.pieces["(stem)"]
        for tap in self.blocks[:index]:
            total = total + self.pieces[f"block:{tap.name}"]
        return total

    def _tail(self, layer: str) -> Units:
        """Units of ``layer`` (final or head): the stem and blocks, plus what follows the last
        block, measured as a function of the last block's output with every block replaced by
        its recorded output (so only the stem and the tail run)."""
        readout, x = self.readout, self.x
        last = self.blocks[-1]
        h = _first_of(self.outputs[last.name]).detach()

        def tail(value: torch.Tensor) -> torch.Tensor:
            for tap in self.blocks:
                output = self.outputs[tap.name]
                if tap is last:
                    is_tuple = isinstance(output, (tuple, list))
                    output = type(output)([value, *output[1:]]) if is_tuple else value
                tap.module.forward = lambda *args, output=output, **kwargs: output
            try:
                return readout(x, (layer,))[layer]
            finally:
                for tap in self.blocks:
                    del tap.module.forward  # the class's forward again

        part = measure(tail, h)
        stem = self.pieces["(stem)"]
        # the tail's forward and JVP call include the stem's (constant) forward
        part = Units(
            part.fwd - stem.fwd,
            part.vjp,
            part.jvp,
            part.jvp_call - stem.fwd,
            part.saved,
            part.peak,
        )
        return self._prefix(len(self.blocks)) + part

    def __call__(self, layers: Sequence[str]) -> Units:
        """Units of one pass over ``layers`` (the forward-mode sketch runs them together)."""
        layers = tuple(layers)
        if layers not in self.whole:
            self.whole[layers] = self._units(layers)
        return self.whole[layers]

    def _units(self, layers: tuple[str, ...]) -> Units:
        names = [tap.name for tap in self.blocks]
        if self.pieces is not None:
            others = [name for name in layers if name not in names]
            try:
                if others:
                    return self._tail("head" if "head" in others else others[-1])
                index = max(names.index(name) for name in layers)
                return self._prefix(index) + self.pieces[f"tap:{names[index]}"]
            except _NotPiecewise:
                pass
        readout = self.readout
        if len(layers) == 1:
            return measure(lambda i: readout(i, layers)[layers[0]], self.x)
        return measure(lambda i: readout(i, layers), self.x)


class _NotPiecewise(Exception):
    """The network does not split into stem, consecutive blocks and a tail."""


def qr_flops(m: int, n: int, with_q: bool = True) -> float:
    """Householder QR of an m x n matrix (m >= n after ordering): 2 m n^2 - 2 n^3 / 3 for R,
    twice that when the thin Q is formed too."""
    m, n = max(m, n), min(m, n)
    flops = 2.0 * m * n * n - 2.0 * n**3 / 3.0
    return 2.0 * flops if with_q else flops


def svdvals_flops(m: int, n: int) -> float:
    """Singular values of an m x n matrix by bidiagonalisation: 4 m n^2 - 4 n^3 / 3 (m >= n)."""
    m, n = max(m, n), min(m, n)
    return 4.0 * m * n * n - 4.0 * n**3 / 3.0


def _spectrum_flops(rows: int, cols: int) -> float:
    """The engine's ``_svdvals``: an R factor first when the matrix is wide (cols > 2 rows)."""
    if cols > 2 * rows:
        return qr_flops(cols, rows, with_q=False) + svdvals_flops(rows, rows)
    return svdvals_flops(rows, cols)


# ----------------------------------------------------------------------------------------------
# The plan of one model
# ----------------------------------------------------------------------------------------------


def _module_bytes(module: nn.Module | None) -> tuple[int, int]:
    """(bytes of parameters and buffers, element size of the first floating one)."""
    if module is None:
        return 0, 4
    tensors = [*module.parameters(), *module.buffers()]
    size = sum(t.numel() * t.element_size() for t in tensors)
    floating = [t for t in tensors if t.is_floating_point()]
    return int(size), floating[0].element_size() if floating else 4


def plan_model(
    model: Any,
    input_shape: Sequence[int],
    *,
    method: str = "auto",
    k: int = 32,
    power_iters: int = 5,
    batch_size: int = 32,
    chunk_size: int = 8,
    images: int = 1,
    layers: Sequence[str] | None = None,
    key: str = "model",
    kind: str = "",
) -> ModelPlan:
    """Per-image Jacobian work of ``model`` (an encoder with taps or a module, ideally on meta)
    at inputs of ``input_shape`` (C, H, W), for the engine's settings (module docstring)."""
    readout = Readout(model)
    layers = readout.check(layers)
    module = readout.module
    param_bytes, itemsize = _module_bytes(module)
    tensors = [*module.parameters(), *module.buffers()] if module is not None else []
    device = tensors[0].device if tensors else torch.device("cpu")  # no tensors: any device
    x = torch.zeros((1, *input_shape), device=device)
    d_in = math.prod(input_shape)
    common = {
        "d_in": d_in,
        "itemsize": itemsize,
        "param_bytes": param_bytes,
        "batch_size": batch_size,
        "chunk_size": chunk_size,
    }
    # the engine's rewrites (patch embeddings as matmuls, global pooling as a mean) count the
    # same FLOPs, and test_plan checks against the engine run with them: plain mode here
    with _jacobian_mode(module):
        with torch.no_grad():
            outputs = readout(x, layers)
        d_out = {name: int(outputs[name].reshape(1, -1).shape[1]) for name in layers}
        del outputs
        methods = _methods(readout, layers, method, d_out, k, power_iters)
        exact = [name for name in layers if methods[name] == "exact"]
        randomized = [name for name in layers if methods[name] == "randomized"]
        chains = readout.chains(exact)
        followers = {child for children in chains.values() for child in children}
        units = TapUnits(model, readout, x)
        costs: dict[str, TapCost] = {}
        for name in exact:
            if name not in followers:
                costs.update(
                    _exact_costs(readout, units, name, chains.get(name, []), x, d_out, **common)
                )
        taps = [costs[name] for name in layers if name in costs]
        if randomized:
            taps += _randomized_costs(units, randomized, d_out, k, power_iters, **common)
        # jacobian_spectra's one forward of every tap on one image (d_out), per call of chunk images
        setup = units(tuple(layers)).fwd / chunk_size
        taps.append(TapCost("(d_out)", "setup", 0, 0, 0, setup, 0.0, float(param_bytes)))
    order = {name: i for i, name in enumerate(["(d_out)", "(sketch)", *layers])}
    taps.sort(key=lambda tap: order.get(tap.name, len(order)))
    return ModelPlan(
        key, kind or type(model).__name__, tuple(input_shape), taps, images, param_bytes
    )


def _exact_costs(
    readout: Readout,
    units: TapUnits,
    root: str,
    chain: Sequence[str],
    x: torch.Tensor,
    d_out: Mapping[str, int],
    *,
    d_in: int,
    itemsize: int,
    param_bytes: int,
    batch_size: int,
    chunk_size: int,
) -> dict[str, TapCost]:
    """``root``: d VJPs; each tap of ``chain``: its row Jacobian and ``local @ rows_parent``."""
    d = d_out[root]
    unit = units((root,))
    n = min(max(1, batch_size // max(d_out[t] for t in (root, *chain))), chunk_size)
    in_flight = min(max(1, batch_size // n), d) * n
    memory = param_bytes + n * unit.saved + in_flight * unit.peak + n * d * d_in * itemsize
    costs = {
        root: TapCost(
            root, "exact", d, 0, d, unit.fwd + d * unit.vjp, _spectrum_flops(d, d_in), float(memory)
        )
    }
    width = d if d_in > 2 * d else d_in  # the root's rows, carried in their R factor when wide
    values = {root: torch.zeros((1, d), device=x.device)}
    for name in chain:
        parent, fn = readout.derived[name]
        with torch.no_grad():
            values[name] = fn(values[parent]).reshape(1, -1)
        local = count_flops(lambda fn=fn, parent=parent: _row_jacobians(fn, values[parent]))
        d_c, d_p = d_out[name], d_out[parent]
        flops = local + 2.0 * d_c * d_p * width
        costs[name] = TapCost(
            name,
            "chain",
            d_c,
            0,
            0,
            float(flops),
            _spectrum_flops(d_c, width),
            float(memory),
            parent=parent,
        )
    return costs


def _randomized_costs(
    units: TapUnits,
    layers: Sequence[str],
    d_out: Mapping[str, int],
    k: int,
    power_iters: int,
    *,
    d_in: int,
    itemsize: int,
    param_bytes: int,
    batch_size: int,
    chunk_size: int,
) -> list[TapCost]:
    """The shared sketch (k JVPs of every randomized tap) and each tap's subspace iteration."""
    n = min(max(1, batch_size // k), chunk_size)
    chunk = max(1, batch_size // n)
    chunks = math.ceil(k / chunk)
    in_flight = min(chunk, k) * n
    q = power_iters
    taps, sketch_peak = [], 0.0
    for name in layers:
        d = d_out[name]
        unit = units((name,))
        if q and math.isnan(unit.jvp):
            raise NotPlanned(f"tap {name} is randomized but has an op without forward-mode AD")
        flops = unit.fwd + q * (chunks * unit.jvp_call + k * unit.jvp) + (q + 1) * k * unit.vjp
        linalg = (
            qr_flops(d, k)  # orth of the sketch
            + q * (qr_flops(d_in, k) + qr_flops(d, k))  # orth(J^T Q), orth(J Z)
            + _spectrum_flops(k, d_in)  # the top k of B = Q^T J
        )
        memory = (
            param_bytes + n * unit.saved + in_flight * unit.peak + n * k * (d_in + d) * itemsize
        )
        sketch_peak = max(sketch_peak, unit.peak)
        taps.append(
            TapCost(name, "randomized", d, q * k, (q + 1) * k, flops, linalg, float(memory))
        )
    together = units(tuple(layers))
    if math.isnan(together.jvp):
        raise NotPlanned(
            f"taps {list(layers)} are randomized but have an op without forward-mode AD"
        )
    directions = n * k * (d_in + sum(d_out[name] for name in layers)) * itemsize
    sketch = TapCost(
        "(sketch)",
        "sketch",
        sum(d_out[name] for name in layers),
        k,
        0,
        chunks * together.jvp_call + k * together.jvp,
        0.0,
        float(param_bytes + in_flight * sketch_peak + directions),
    )
    return [sketch, *taps]


# ----------------------------------------------------------------------------------------------
# Building the config's models on the meta device
# ----------------------------------------------------------------------------------------------


class NotPlanned(RepdiagError):
    """A model the planner cannot build offline; the message says why."""


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({name: "1" for name in saved})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _assemble(key: str, entry: Mapping[str, Any], built: Any, default_pooling: str) -> Any:
    """An :class:`~repdiag.encoders.Encoder` from a ``Built`` (what ``build_encoder`` does last)."""
    from repdiag.encoders.registry import Encoder
    from repdiag.encoders.taps import tap_plan

    preprocess = built.preprocess.updated(entry.get("preprocess"))
    pooling = entry.get("pooling") or built.pooling or default_pooling
    model = built.model.eval()
    model.requires_grad_(False)
    return Encoder(
        key=key,
        source=str(entry.get("source")),
        family=str(entry.get("family", "other")),
        model=model,
        preprocess=preprocess,
        pooling=pooling,
        plan=tap_plan(model, pooling),
        entry=dict(entry),
    )


class _WideResNet50(nn.Module):
    """VICReg's ResNet-50 x2 (facebookresearch/vicreg resnet.py, ``widen=2``): timm's ResNet-50
    with channels 128/256/512/1024 and a 128-wide stem, run as torchvision/VICReg do (global
    average pooling after layer4, no fc), so it gets the same taps as the hub model."""

    def __init__(self) -> None:
        super().__init__()
        import timm

        net = timm.create_model(
            "resnet50",
            pretrained=False,
            num_classes=0,
            channels=(128, 256, 512, 1024),
            stem_width=128,
        )
        self.conv1, self.bn1, self.act1, self.maxpool = net.conv1, net.bn1, net.act1, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            net.layer1,
            net.layer2,
            net.layer3,
            net.layer4,
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.avgpool(x).flatten(1)


def _hub_model(key: str, entry: Mapping[str, Any]) -> nn.Module:
    name = str(entry["id"])
    if name not in HUB_ARCHITECTURES:
        raise NotPlanned(
            f"hub entry point {name!r} needs its local checkout {entry.get('repo')} "
            "(hubconf.py), which is absent, and its architecture is not known to the planner"
        )
    if name in ("resnet50w2", "resnet50x2"):
        return _WideResNet50()
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    model.fc = nn.Identity()
    return model


def _zoo_model(config: Mapping[str, Any], run: str) -> tuple[nn.Module, Any, str]:
    """The zoo run's architecture from its spec (what ``train_zoo`` builds), random weights."""
    from repdiag.encoders.heads import WithHead
    from repdiag.encoders.preprocess import Preprocess
    from repdiag.encoders.zoo.backbones import backbone_kwargs, build_backbone, pooling
    from repdiag.encoders.zoo.objectives import OBJECTIVES
    from repdiag.encoders.zoo.scenes import SceneConfig
    from repdiag.encoders.zoo.spec import run_spec

    if run not in ((config.get("zoo") or {}).get("objectives") or {}):
        raise NotPlanned(f"zoo run {run!r} is not in zoo.objectives")
    spec = run_spec(config, run)
    cls = OBJECTIVES.get(spec["objective"])
    kwargs = backbone_kwargs(
        spec["timm_model"], spec["timm_kwargs"], spec["image_size"], cls.backbone_extras
    )
    scenes = SceneConfig.from_config(spec["scenes"], spec["image_size"])
    objective = cls(build_backbone(spec["timm_model"], kwargs), scenes, **spec["hparams"])
    backbone, head = objective.export()
    model = backbone if head is None else WithHead(backbone, head)
    size = int(spec["image_size"])
    preprocess = Preprocess(size, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear")
    return model, preprocess, pooling(backbone)


def build_on_meta(
    key: str, entry: Mapping[str, Any], config: Mapping[str, Any], default_pooling: str = "cls"
) -> tuple[Any, str]:
    """The encoder of ``models.<key>`` with random weights on the meta device, and how it was
    built. Nothing is read or downloaded: pretrained tags, weights files and checkpoints are
    ignored (only the architecture matters). Raises :class:`NotPlanned` when that is impossible."""
    from repdiag.encoders.entries import check_kwargs
    from repdiag.encoders.registry import Built, build_encoder

    source, name = str(entry.get("source")), str(entry.get("id"))
    plain = {k: v for k, v in entry.items() if k not in ("weights", "covariates")}
    with _offline(), torch.device(META):
        if source in ("timm", "checkpoint"):
            encoder = build_encoder(key, {**plain, "source": "timm", "pretrained": False})
            return encoder, f"timm {name}"
        if source == "torchvision":
            return build_encoder(key, {**plain, "pretrained": None}), f"torchvision {name}"
        if source == "open_clip":
            import open_clip

            from repdiag.encoders.preprocess import from_open_clip

            check_kwargs(key, entry)
            model = open_clip.create_model(
                name, pretrained=None, device=META, **dict(entry.get("kwargs") or {})
            )
            preprocess = from_open_clip(open_clip.get_model_preprocess_cfg(model))
            built = Built(model.visual, preprocess)
            return _assemble(key, entry, built, default_pooling), f"open_clip {name}"
        if source == "hub":
            repo = Path(str(entry.get("repo") or "")).expanduser()
            if (repo / "hubconf.py").is_file():
                return build_encoder(key, plain), f"hub {repo.name}:{name} (local checkout)"
            from repdiag.encoders.preprocess import from_torchvision

            built = Built(_hub_model(key, entry), from_torchvision(None))
            return _assemble(key, entry, built, default_pooling), HUB_ARCHITECTURES[name]
        if source == "zoo":
            model, preprocess, trained_pooling = _zoo_model(config, name)
            built = Built(model, preprocess, pooling=trained_pooling)
            return _assemble(key, entry, built, default_pooling), f"zoo run {name} (from its spec)"
    if source == "python":  # user code: built here, then moved to meta (see plan_config)
        with _offline():
            return build_encoder(key, plain).to(META), f"python {name}"
    raise NotPlanned(f"source {source!r} is not known to the planner")


# ----------------------------------------------------------------------------------------------
# The whole config
# ----------------------------------------------------------------------------------------------


def measure_rate(size: int = 2048, repeats: int = 3, device: str | None = None) -> float:
    """float32 matmul FLOP/s here: best of ``repeats`` ``size`` x ``size`` products (2 n^3 each)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    best = math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def plan_config(
    config: Mapping[str, Any],
    *,
    rate: float | None = None,
    device: str = "cpu",
    models: Sequence[str] | None = None,
) -> Plan:
    """The cost plan of every model (or ``models``) of a loaded config (defaults filled).

    ``device`` chooses the default ``batch_size`` when the config leaves it null (32 on CPU,
    512 on a GPU). ``rate`` in FLOP/s; default: :func:`measure_rate` on this machine.
    """
    jacobians = config["jacobians"]
    batch_size = int(jacobians.get("batch_size") or DEFAULT_BATCH_SIZE[device])
    images = sum(probe_counts(jacobians).values())
    settings = {
        "method": jacobians["method"],
        "k": int(jacobians["k"]),
        "power_iters": int(jacobians["power_iters"]),
        "batch_size": batch_size,
        "chunk_size": int(jacobians["chunk_size"]),
        "layers": list(jacobians.get("layers") or []),
        "images": images,
        "device": device,
        # FLOPs do not depend on it; the rate does (--rate: the device's peak at this precision)
        "precision": str(jacobians.get("precision") or "fp32"),
    }
    default_pooling = (config.get("embeddings") or {}).get("pooling") or "cls"
    planned, skipped, seen = [], {}, {}
    entries = config.get("models") or {}
    for key in models or list(entries):
        engine = {
            "method": settings["method"],
            "k": settings["k"],
            "power_iters": settings["power_iters"],
            "batch_size": batch_size,
            "chunk_size": settings["chunk_size"],
            "images": images,
            "layers": settings["layers"] or None,
            "key": key,
        }
        try:
            encoder, how = build_on_meta(key, entries[key], config, default_pooling)
            shape = (3, int(encoder.preprocess.input_size), int(encoder.preprocess.input_size))
            signature = (str(encoder.model), encoder.pooling, shape)
            if signature in seen:  # the same architecture (e.g. two seeds): same costs
                plan = dataclasses.replace(seen[signature], key=key, kind=how)
            else:
                try:
                    plan = plan_model(encoder, shape, kind=how, **engine)
                except Exception:
                    if entries[key].get("source") != "python":
                        raise
                    # a control whose forward makes tensors of its own: counted on one real image
                    from repdiag.encoders.registry import build_encoder

                    with _offline():
                        encoder = build_encoder(key, entries[key])
                    plan = plan_model(encoder, shape, kind=f"{how} (counted on CPU)", **engine)
                seen[signature] = plan
            planned.append(plan)
        except Exception as err:  # any model that cannot be built or counted is left out
            skipped[key] = f"{type(err).__name__}: {err}".splitlines()[0][:200]
    if rate is None:
        rate, source = measure_rate(), f"measured here (float32 matmul, {_device_name()})"
    else:
        source = "given"
    return Plan(planned, skipped, settings, float(rate), source)


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def human_flops(flops: float) -> str:
    """FLOPs with an SI prefix: ``1.23 TFLOP``."""
    for prefix, scale in (
        ("E", 1e18),
        ("P", 1e15),
        ("T", 1e12),
        ("G", 1e9),
        ("M", 1e6),
        ("k", 1e3),
    ):
        if abs(flops) >= scale:
            return f"{flops / scale:.3g} {prefix}FLOP"
    return f"{flops:.3g} FLOP"


def human_bytes(size: float) -> str:
    """Bytes in binary units: ``1.5 GiB``."""
    for prefix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if abs(size) >= scale * 1000 / 1024:  # 0.99 GiB rather than 1.01e+03 MiB
            return f"{size / scale:.3g} {prefix}B"
    return f"{size:.0f} B"


def human_seconds(seconds: float) -> str:
    """Seconds as ``s``, ``min``, ``h`` or ``d``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def format_plan(plan: Plan, *, per_tap: bool = True) -> str:
    """The plan as text: a table per model and tap, per-model totals, the grand total."""
    s = plan.settings
    lines = [
        f"Jacobian cost plan: method {s['method']}, k = {s['k']}, q = {s['power_iters']}, "
        f"batch {s['batch_size']} products per pass ({s['device']}), chunk {s['chunk_size']} "
        f"images, {s['images']} probe images, taps {s['layers'] or 'all'}, precision "
        f"{s.get('precision', 'fp32')}",
        "counted GFLOP: FlopCounterMode on meta (matmul, conv, attention) per probe image; "
        "linalg: QR/SVD, textbook counts; memory: estimated peak of one pass",
        "",
    ]
    header = (
        f"{'tap':<12} {'method':<14} {'d_out':>6} {'JVPs':>6} {'VJPs':>6} "
        f"{'GFLOP/image':>12} {'linalg GFLOP':>12} {'memory/pass':>12}"
    )
    for model in plan.models:
        lines.append(
            f"{model.key}: {model.kind}, input {'x'.join(map(str, model.input_shape))}, "
            f"parameters {human_bytes(model.param_bytes)}"
        )
        if per_tap:
            lines.append("  " + header)
            for tap in model.taps:
                method = tap.method if tap.parent is None else f"chain<{tap.parent}"
                lines.append(
                    f"  {tap.name:<12} {method:<14} {tap.d_out:>6} {tap.jvps:>6} {tap.vjps:>6} "
                    f"{tap.flops / 1e9:>12.1f} {tap.linalg_flops / 1e9:>12.2f} "
                    f"{human_bytes(tap.memory_bytes):>12}"
                )
        lines.append(
            f"  total: {model.products_per_image} products, "
            f"{human_flops(model.flops_per_image)} + {human_flops(model.linalg_per_image)} linalg "
            f"per image; {human_flops(model.total_flops)} for {model.images} images; "
            f"peak memory/pass {human_bytes(model.peak_memory_bytes)}; "
            f"{human_seconds(model.total_flops / plan.rate)}; "
            f"{100 * model.total_flops / max(plan.total_flops, 1.0):.1f}% of the total"
        )
        lines.append("")
    for key, why in plan.skipped.items():
        lines.append(f"not planned: {key}: {why}")
    if plan.skipped:
        lines.append(f"({len(plan.skipped)} models not planned, excluded from the totals)")
        lines.append("")
    lines += [
        f"grand total: {len(plan.models)} models x {s['images']} probe images: "
        f"{human_flops(plan.total_flops)} "
        f"({human_flops(plan.total_flops / max(1, s['images']))} per probe image)",
        f"at {plan.rate / 1e12:.3g} TFLOP/s ({plan.rate_source}): "
        f"{human_seconds(plan.seconds)} (a lower bound: kernels reach a fraction of peak)",
    ]
    return "\n".join(lines)


def command(argv: Sequence[str]) -> None:
    """``repdiag plan <config> [--rate FLOP/s] [--device cpu|cuda] [--models ...] [--totals]``."""
    parser = argparse.ArgumentParser(
        prog="repdiag plan",
        description="Jacobian work, memory per pass and projected time of a config's Jacobian "
        "stage, counted offline on random-weight models on the meta device",
    )
    parser.add_argument("config", help="a YAML config, e.g. config/paper.yaml")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="FLOP rate in FLOP/s, e.g. 67e12 (default: measured here)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="target device for a null jacobians.batch_size (default: cuda when "
        "--rate is given, else this machine's)",
    )
    parser.add_argument("--models", nargs="+", default=None, help="plan only these model keys")
    parser.add_argument("--totals", action="store_true", help="per-model totals only")
    args = parser.parse_args(list(argv))
    from repdiag.core.config import load_config

    config = load_config(args.config)
    device = args.device or (
        "cuda" if args.rate is not None or torch.cuda.is_available() else "cpu"
    )
    unknown = sorted(set(args.models or []) - set(config["models"]))
    if unknown:
        raise RepdiagError(f"unknown models {unknown}; the config has {sorted(config['models'])}")
    plan = plan_config(config, rate=args.rate, device=device, models=args.models)
    print(format_plan(plan, per_tap=not args.totals))
