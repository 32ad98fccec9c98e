"""CUDA simulated on the CPU, with CUDA's same-device rule, for tests on machines without a GPU.

Inside :func:`simulated_cuda`, a tensor moved or created on ``cuda:0`` is a :class:`CudaTensor`:
real CPU data that reports ``device == cuda:0`` (``is_cuda``, no ``.numpy()``). Every aten op
goes through :func:`_run`, which enforces what real CUDA enforces and raises
:class:`DeviceMismatch` naming the op and the repdiag (else caller) file and line:

- an op mixing a ``cuda:0`` tensor with a CPU tensor of one or more dimensions ("Expected all
  tensors to be on the same device"; CPU 0-dim tensors pass, as on CUDA; copies and indexing
  with CPU indices pass, as on CUDA);
- a random op on ``cuda:0`` given a CPU generator ("Expected a 'cuda' device type for
  generator");
- ``.numpy()`` of a ``cuda:0`` tensor;
- a CPU tensor, even a 0-dim one, among the inputs of ``torch.stack`` or ``torch.cat`` with
  ``cuda:0`` tensors (CUDA lets a CPU scalar into elementwise ops only, :data:`NO_CPU_SCALARS`).

Inside the simulation CUDA is "available": ``torch.cuda.is_available()``, ``device_count()``,
``get_device_name``, ``get_device_capability``, ``is_bf16_supported`` and
``torch.accelerator.is_available()`` answer as on one GPU, so the code's CUDA branches run (pinned
memory, the TF32 capability check, ``select_device("auto")``); ``Tensor.pin_memory`` returns a
copy. ``torch.cuda.mem_get_info``, ``memory_allocated``, ``max_memory_allocated``,
``reset_peak_memory_stats``, ``empty_cache`` and ``synchronize`` read and write a
:class:`SimulatedMemory` (configurable free and total bytes; a test sets the peak a pass reaches).
Autocast on ``cuda`` computes as CPU autocast does: under ``torch.autocast("cuda",
dtype=torch.bfloat16)`` each op runs under CPU autocast with that dtype, so matmuls and
convolutions compute in bfloat16 (the wrapper's own device has no autocast key of its own).

The data live on the CPU, so autograd, ``torch.func``, optimisers and ``.item()`` work as on a GPU.
Why not ``FakeTensorMode``: fake tensors hold no data (no ``.item()``, so no training loop), and
autograd's engine refuses a backward pass on a CUDA device when no GPU is visible. The device
here is ``cuda:0`` (a bare ``"cuda"`` asks the driver for the current index, which fails without a
GPU). What it cannot see: kernels that exist on CPU only, TF32 and cuDNN numerics, CUDA's own
autocast op lists (CPU autocast's are used) and real memory use (only what a test sets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
# The wrapper's own (C++) device: what torch's C++ code reads when it makes a tensor "like" a
# CUDA one (tensor.options()); a factory op asked for META is one of those, so it is CUDA too.
META = torch.device("meta")
_aten = torch.ops.aten
# Ops that CUDA runs with CPU tensors among their arguments: copies between devices, and
# indexing a CUDA tensor with CPU indices.
MIXED_DEVICES_ALLOWED = {
    _aten.to,
    _aten._to_copy,
    _aten.copy_,
    _aten.index,
    _aten.index_put,
    _aten.index_put_,
    _aten._index_put_impl_,
}
# Ops that refuse a CPU tensor beside CUDA ones even when it has 0 dimensions: CUDA lets CPU
# scalars into TensorIterator (elementwise) kernels only.
NO_CPU_SCALARS = {_aten.cat, _aten.stack}
_TENSOR = torch.tensor
_HERE = str(Path(__file__).resolve())
_ROOT = str(Path(__file__).resolve().parent.parent)


class DeviceMismatch(RuntimeError):
    """What real CUDA would have raised, with the file and line that caused it."""


def where() -> str:
    """The innermost repdiag (or workflow script) frame of the current stack, else the innermost
    frame outside torch and this module: ``path:line in function: source``."""
    frames = [
        f
        for f in traceback.extract_stack()
        if f.filename != _HERE and "/torch/" not in f.filename and "contextlib" not in f.filename
    ]
    ours = [f for f in frames if "/repdiag/" in f.filename or "/workflow_scripts/" in f.filename]
    frame = (ours or frames)[-1]
    path = frame.filename.removeprefix(_ROOT + "/")
    return f"{path}:{frame.lineno} in {frame.name}: {frame.line}"


class CudaTensor(torch.Tensor):
    """A tensor on simulated ``cuda:0``: ``elem`` holds its (CPU) data."""

    elem: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> CudaTensor:
        wrapped = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=META,
            requires_grad=elem.requires_grad,
        )
        wrapped.elem = elem
        return wrapped

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise DeviceMismatch(
            "can't convert cuda:0 device type tensor to numpy: use Tensor.cpu() first "
            f"(simulated CUDA, at {where()})"
        )

    def new_tensor(self, data: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        # torch builds it below the dispatcher's Python key, on the wrapper's C++ device (meta)
        device = kwargs.pop("device", None)
        kwargs.setdefault("dtype", self.dtype)
        made = _TENSOR(data, **kwargs)
        return made if device is not None and not _on_cuda(device) else CudaTensor(made)

    def tolist(self) -> Any:
        _host_read()
        return self.elem.tolist()

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        # the wrapper's C++ device is the CPU, where Tensor.cpu would alias instead of copying
        return _aten._to_copy.default(self, device=CPU)

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cpu":
            moved = _aten._to_copy.default(self, device=CPU)
            return moved if dtype is None else moved.to(dtype)
        return super().to(*args, **kwargs)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"CudaTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _on_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type in ("cuda", "meta")


def _check(func: Any, args: Any, kwargs: dict[str, Any]) -> None:
    if func.overloadpacket in MIXED_DEVICES_ALLOWED:
        return
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    strict = func.overloadpacket in NO_CPU_SCALARS
    if any(not isinstance(t, CudaTensor) and (strict or t.dim() > 0) for t in tensors):
        raise DeviceMismatch(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda:0 and cpu! ({func}; simulated CUDA, at {where()})"
        )
    generator = kwargs.get("generator")
    if generator is not None and generator.device.type != "cuda":
        raise DeviceMismatch(
            f"Expected a 'cuda' device type for generator but found '{generator.device.type}' "
            f"({func}; simulated CUDA, at {where()})"
        )


# Ops that return data the host must wait for (a CUDA synchronisation each); a copy of a cuda:0
# tensor to the CPU is one too.
HOST_READS = {_aten._local_scalar_dense, _aten.nonzero, _aten.is_nonzero, _aten.equal}


def _host_read() -> None:
    if _ACTIVE:
        _ACTIVE[-1].host_reads[where()] += 1


def _run(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on the CPU data; its outputs are on cuda:0 when an input is or when asked."""
    on_cuda = any(isinstance(t, CudaTensor) for t in tree_leaves((args, kwargs)))
    devices = [d for d in tree_leaves((args, kwargs)) if isinstance(d, torch.device)]
    target = devices[0] if devices else None
    if on_cuda and (
        func.overloadpacket in HOST_READS
        or (func.overloadpacket is _aten._to_copy and target is not None and not _on_cuda(target))
    ):
        _host_read()
    if target is not None:  # the op's device argument, given by keyword or by position
        args, kwargs = tree_map(lambda v: CPU if isinstance(v, torch.device) else v, (args, kwargs))
    moves = func.overloadpacket in MIXED_DEVICES_ALLOWED
    wrap = _on_cuda(target) or (on_cuda and (target is None or not moves))
    if wrap:
        _check(func, args, kwargs)
    if func is _aten._efficientzerotensor.default:
        func = _aten.zeros.default  # a data-less zero tensor would not survive the unwrapping
    plain_args, plain_kwargs = tree_map(_unwrap, (args, kwargs))
    if wrap:
        plain_args, plain_kwargs = _same_dtype(func, plain_args, plain_kwargs)
    with _cpu_autocast() if wrap else contextlib.nullcontext():
        out = func(*plain_args, **plain_kwargs)
    if not wrap:
        return out
    # an in-place op returns its input's data: give back the input itself
    inputs = {id(t.elem): t for t in tree_leaves(args) if isinstance(t, CudaTensor)}
    return tree_map(lambda value: inputs[id(value)] if id(value) in inputs else _wrap(value), out)


# Ops whose CPU kernels refuse inputs of two floating dtypes. Autocast casts below autograd here
# (the wrapper's C++ device has no autocast key), so autograd never saw the cast: the backward of
# an op run in bfloat16 meets its float32 inputs, which CUDA would have saved as bfloat16 copies.
# They are cast to the narrowest floating dtype among them, as CUDA's saved copies were.
SAME_DTYPE_OPS = {
    _aten.mm,
    _aten.addmm,
    _aten.bmm,
    _aten.baddbmm,
    _aten.addbmm,
    _aten.mv,
    _aten.addmv,
    _aten.dot,
    _aten.convolution,
    _aten.convolution_backward,
    _aten._convolution,
}
_AUTOCAST = threading.local()  # the stack of (enabled, dtype) of CUDA autocast blocks entered
_AUTOCAST_ENTER = torch.amp.autocast_mode.autocast.__enter__
_AUTOCAST_EXIT = torch.amp.autocast_mode.autocast.__exit__


def _autocast_enter(self: Any) -> Any:
    """``torch.autocast.__enter__``, noting CUDA autocast's state where :func:`_run` can read it
    (inside a dispatch every autocast key is excluded, so torch reports it off there)."""
    result = _AUTOCAST_ENTER(self)
    stack = _AUTOCAST.__dict__.setdefault("stack", [])
    stack.append((_IS_AUTOCAST_ENABLED("cuda"), torch.get_autocast_dtype("cuda")))
    return result


def _autocast_exit(self: Any, *args: Any) -> Any:
    stack = _AUTOCAST.__dict__.setdefault("stack", [])
    if stack:
        stack.pop()
    return _AUTOCAST_EXIT(self, *args)


def _cpu_autocast() -> contextlib.AbstractContextManager:
    """CPU autocast with CUDA's dtype while a CUDA autocast block is on, so that the op computes
    in that dtype as it would on CUDA."""
    stack = getattr(_AUTOCAST, "stack", None)
    if not stack or not stack[-1][0]:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=stack[-1][1], cache_enabled=False)


def _same_dtype(func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The inputs of a :data:`SAME_DTYPE_OPS` op cast to their narrowest floating dtype."""
    if func.overloadpacket not in SAME_DTYPE_OPS:
        return args, kwargs
    dtypes = {
        t.dtype
        for t in tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    }
    if len(dtypes) < 2:
        return args, kwargs
    narrow = min(dtypes, key=lambda dtype: torch.finfo(dtype).bits)

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(narrow)
        return value

    return tree_map(cast, (args, kwargs))


def _unwrap(value: Any) -> Any:
    return value.elem if isinstance(value, CudaTensor) else value


def _wrap(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and not isinstance(value, CudaTensor):
        # a normal tensor even under inference_mode: torch gives views of normal tensors made
        # there a version counter, which an inference-mode wrapper refuses
        with torch.inference_mode(False):
            return CudaTensor(value)
    return value


def _from_data(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.tensor`` or ``torch.as_tensor``, simulated for ``device=cuda``: torch copies the
    data to the device below the dispatcher's Python key, where no mode sees it."""

    def simulated(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if not _on_cuda(device):
            return make(data, *args, device=device, **kwargs)
        if isinstance(data, CudaTensor):
            return make(data, *args, **kwargs)
        return CudaTensor(make(data, *args, **kwargs))

    return simulated


_IS_AUTOCAST_ENABLED = torch.is_autocast_enabled


def _autocast_enabled(device_type: str | None = None) -> bool:
    """Inside ``torch.func`` transforms a simulated tensor reports its C++ device (meta)."""
    if device_type is None:
        return _IS_AUTOCAST_ENABLED()
    return _IS_AUTOCAST_ENABLED("cuda" if device_type == "meta" else device_type)


class _Mode(TorchDispatchMode):
    """Sees factory ops too (``torch.arange(..., device="cuda:0")``), which no tensor carries."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


GiB = 1 << 30


@dataclasses.dataclass
class SimulatedMemory:
    """The simulated device's memory and clock, as ``torch.cuda``'s functions report them.

    ``free``/``total``: what ``mem_get_info`` returns; ``allocated``: ``memory_allocated``;
    ``peak``: ``max_memory_allocated`` (``reset_peak_memory_stats`` sets it to ``allocated``; a
    test raises it to what a pass would reach). ``capability``: ``get_device_capability``.
    ``synchronized``, ``emptied``: calls of ``synchronize`` and ``empty_cache``.
    ``host_reads``: where the host waited for the device's data (``.item()``, ``bool()``,
    ``.tolist()``, ``nonzero``, a copy to the CPU: each a synchronisation on CUDA), by
    :func:`where` (``sum(host_reads.values())`` is their number)."""

    free: int = 70 * GiB
    total: int = 80 * GiB
    allocated: int = 0
    peak: int = 0
    capability: tuple[int, int] = (9, 0)
    name: str = "simulated CUDA (CPU data)"
    synchronized: int = 0
    emptied: int = 0
    host_reads: Counter[str] = dataclasses.field(default_factory=Counter)

    def reset_peak(self, device: Any = None) -> None:
        self.peak = self.allocated

    def synchronize(self, device: Any = None) -> None:
        self.synchronized += 1

    def empty_cache(self) -> None:
        self.emptied += 1

    def patches(self) -> dict[str, Any]:
        """{dotted name: replacement} for ``mock.patch``."""
        return {
            "torch.cuda.is_available": lambda: True,
            "torch.cuda.device_count": lambda: 1,
            "torch.cuda.current_device": lambda: 0,
            "torch.cuda.is_bf16_supported": lambda *args, **kwargs: True,
            "torch.cuda.get_device_name": lambda device=None: self.name,
            "torch.cuda.get_device_capability": lambda device=None: self.capability,
            "torch.cuda.mem_get_info": lambda device=None: (self.free, self.total),
            "torch.cuda.memory_allocated": lambda device=None: self.allocated,
            "torch.cuda.max_memory_allocated": lambda device=None: self.peak,
            "torch.cuda.reset_peak_memory_stats": self.reset_peak,
            "torch.cuda.synchronize": self.synchronize,
            "torch.cuda.empty_cache": self.empty_cache,
            "torch.accelerator.is_available": lambda *args, **kwargs: True,
            "torch.accelerator.current_accelerator": lambda *args, **kwargs: CUDA,
            "torch.accelerator.current_device_index": lambda: 0,
            "torch.accelerator.current_stream": lambda *args, **kwargs: _STREAM,
            "torch.cuda.current_stream": lambda *args, **kwargs: _STREAM,
            "torch.cuda.is_current_stream_capturing": lambda: False,
            "torch.Tensor.pin_memory": _pin_memory,
        }


class _Stream:
    """The simulated device's one stream: never capturing a graph, always done."""

    def is_capturing(self) -> bool:
        return False

    def synchronize(self) -> None:
        simulated_memory().synchronize()

    def query(self) -> bool:
        return True


_STREAM = _Stream()


def _pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A pinned copy is a copy here; pinning a CUDA tensor fails as on CUDA."""
    if isinstance(self, CudaTensor):
        raise DeviceMismatch(f"cannot pin 'CUDA' memory, only dense CPU tensors ({where()})")
    return self.clone()


_ACTIVE: list[SimulatedMemory] = []


def simulated_memory() -> SimulatedMemory:
    """The :class:`SimulatedMemory` of the innermost active simulation."""
    if not _ACTIVE:
        raise RuntimeError("no simulated CUDA is active")
    return _ACTIVE[-1]


@contextlib.contextmanager
def simulated_cuda(memory: SimulatedMemory | None = None) -> Iterator[torch.device]:
    """Yield ``cuda:0``, simulated (module docstring). CUDA is never initialised; modules moved
    with ``.to(cuda)`` get new parameters (as ``torch.__future__``'s overwrite option does).
    ``memory``: the device's memory and capability (default: a fresh :class:`SimulatedMemory`,
    70 of 80 GiB free, compute capability 9.0); :func:`simulated_memory` returns it."""
    memory = SimulatedMemory() if memory is None else memory
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    _ACTIVE.append(memory)
    try:
        with contextlib.ExitStack() as stack:
            for name, replacement in {
                "torch.cuda._lazy_init": lambda: None,
                "torch.tensor": _from_data(torch.tensor),
                "torch.as_tensor": _from_data(torch.as_tensor),
                "torch.is_autocast_enabled": _autocast_enabled,
                "torch.amp.autocast_mode.autocast.__enter__": _autocast_enter,
                "torch.amp.autocast_mode.autocast.__exit__": _autocast_exit,
                **memory.patches(),
            }.items():
                stack.enter_context(mock.patch(name, replacement))
            stack.enter_context(_Mode())
            yield CUDA
    finally:
        _ACTIVE.pop()
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
