"""Counting the unit costs of one probe image on the meta device, for the planner
(:mod:`.plan_costs`).

:class:`torch.utils.flop_counter.FlopCounterMode` counts matmuls, convolutions and attention
(2 FLOPs per multiply-add). For each tap l: ``fwd_l`` (a forward pass up to l), ``vjp_l`` (one
vector-Jacobian product, input gradient only: the parameters are frozen), ``jvp_l`` (one more
direction of a vmapped Jacobian-vector product) and ``call_l`` (the rest of one vmapped JVP call:
the primal forward, plus the primal times the parameters' zero tangents where an op runs
torch's own forward-mode rule rather than the engine's :mod:`.tangent_rules`) (:class:`Units`,
:func:`measure`, run under the engine's rewrites). A network that is a stem,
consecutive blocks and a tail is counted piecewise, each distinct block once (:class:`TapUnits`).
Memory: A_l, the bytes one image's forward keeps for the backward, and G_l, the peak extra bytes
of one VJP, measured on meta by tracking live tensors (:class:`LiveBytes`).

QR and SVD are not counted by FlopCounterMode; their FLOPs are the textbook counts of Householder
QR (``2 m n^2 - 2 n^3 / 3`` for R, twice that with Q) and values-only SVD
(``4 m n^2 - 4 n^3 / 3``), m >= n (:func:`qr_flops`, :func:`svdvals_flops`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from repdiag.encoders.jacobian.engine import Readout


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
    call, done once per call: the primal forward, and the products of the primal with the
    parameters' zero tangents where torch's own rules run); ``saved``: bytes the forward keeps for the backward; ``peak``: extra
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


def spectrum_flops(rows: int, cols: int) -> float:
    """The engine's ``_svdvals``: an R factor first when the matrix is wide (cols > 2 rows)."""
    if cols > 2 * rows:
        return qr_flops(cols, rows, with_q=False) + svdvals_flops(rows, rows)
    return svdvals_flops(rows, cols)
