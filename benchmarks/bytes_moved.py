"""Bytes moved per Jacobian pass, by op class: a census on the CPU of a small ViT (timm
``vit_tiny_patch16_224`` with random weights, shrunk by the options) through the engine's pass
(:func:`repdiag.encoders.jacobian.engine.jacobian_spectra`, the paper's ``auto`` method: the
per-tap vmapped JVPs and VJPs of torch.func, QR and SVD).

    .venv/bin/python benchmarks/bytes_moved.py [--depth 4 --dim 64 --size 64 --patch 8 ...]

Every aten op the pass runs is seen by a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
below torch.func's transforms (the batched ops themselves); an op's bytes are those of its tensor
inputs plus its outputs, each read or written once: what an unfused kernel moves through memory,
without cache reuse. Views (``view``, ``transpose``, ``expand``, ...) move nothing and are not
counted. The classes (:func:`op_class`), which sum to the total:

* ``matmul``: mm, addmm, bmm and convolutions, except attention's batched matmuls;
* ``attention_bmm``: a batched matmul with a tokens x tokens operand or result (q k^T, attn v,
  their tangents and cotangents);
* ``copies``: copy_, _to_copy, clone, cat, stack (``copies_same_dtype``: those whose output has
  its input's dtype, e.g. float32 to float32);
* ``elementwise``: ops tagged pointwise (adds, multiplies, GELU: ``gelu`` alone);
* ``linalg``: QR, SVD and the other ``linalg_*`` ops;
* ``other``: reductions, softmax, layer norm, indexing and the rest.

It counts bytes, not time: on a GPU the same classes take bytes / bandwidth unless fused. The
CPU census of a tiny ViT is not the ViT-L pass of docs/performance.md; it shows which classes
the engine's forward-mode path through a ViT produces and in what proportions at this size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_paper, beside this file

CLASSES = ("matmul", "attention_bmm", "copies", "elementwise", "linalg", "other")
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "dot", "mv", "addmv", "convolution",
          "_convolution", "convolution_backward", "matmul", "linear"}  # fmt: skip
BATCHED = {"bmm", "baddbmm"}
COPIES = {"copy_", "_to_copy", "clone", "cat", "stack", "_copy_from", "copy"}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def op_class(func: torch._ops.OpOverload, inputs: list, outputs: list, tokens: int) -> str | None:
    """The class of one aten op (None: a view, which moves nothing)."""
    name = func.overloadpacket.__name__
    if func.is_view or name in {"view", "_unsafe_view", "alias", "detach", "lift_fresh"}:
        return None
    if name in MATMUL:
        square = (tokens, tokens)
        if name in BATCHED and any(tuple(t.shape[-2:]) == square for t in inputs + outputs):
            return "attention_bmm"
        return "matmul"
    if name in COPIES:
        return "copies"
    if name.startswith("linalg_") or name in {"_linalg_svd", "_linalg_eigh", "geqrf", "orgqr"}:
        return "linalg"
    if torch.Tag.pointwise in func.tags:
        return "elementwise"
    return "other"


def _run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``; on the meta device (shapes only), a copy to another device is
    answered with zeros of its shape: the engine hands its spectra to the CPU at the end."""
    source = args[0] if args and isinstance(args[0], torch.Tensor) else None
    target = kwargs.get("device")
    if source is not None and source.is_meta and target is not None and target.type != "meta":
        return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype, device=target)
    return func(*args, **kwargs)


class ByteCensus(TorchDispatchMode):
    """Bytes of the tensor inputs plus outputs of every op run under it, by :func:`op_class`."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.bytes: dict[str, int] = dict.fromkeys(CLASSES, 0)
        self.detail: dict[str, int] = {"gelu": 0, "copies_same_dtype": 0}
        self.ops: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = _run(func, args, kwargs or {})
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        kind = op_class(func, inputs, outputs, self.tokens)
        if kind is not None:
            moved = _bytes(inputs) + _bytes(outputs)
            self.bytes[kind] += moved
            name = func.overloadpacket.__name__
            self.ops[name] += moved
            if name.startswith("gelu"):
                self.detail["gelu"] += moved
            if kind == "copies" and inputs and outputs and inputs[0].dtype == outputs[0].dtype:
                self.detail["copies_same_dtype"] += moved
        return out


@dataclass(frozen=True)
class Pass:
    """One engine pass (``auto``, float32) of a timm ViT with random weights: ``kwargs`` shrink
    the model (empty: the model as timm builds it), ``layers`` default to the middle block and
    ``final``, as the paper's pass on ViT-L."""

    name: str = "vit_tiny_patch16_224"
    kwargs: dict = field(default_factory=dict)
    images: int = 2
    k: int = 8
    power_iters: int = 2
    layers: tuple[str, ...] = ()
    device: str = "cpu"
    size: int = 224
    patch: int = 14

    @property
    def tokens(self) -> int:  # the patches and the class token
        return (self.size // self.patch) ** 2 + 1


def small_vit(depth: int = 2, dim: int = 32, size: int = 32, patch: int = 8, **rest) -> Pass:
    """A tiny ViT of ``depth`` blocks and width ``dim`` on ``size`` px images, on the CPU."""
    kwargs = {"img_size": size, "patch_size": patch, "embed_dim": dim, "depth": depth,
              "num_heads": max(1, dim // 32)}  # fmt: skip
    block = f"block{depth // 2 - 1:02d}" if depth > 1 else "block00"
    return Pass(kwargs=kwargs, layers=(block, "final"), size=size, patch=patch, **rest)


# The paper's ViT-L/14 pass (benchmarks/gpu_paper.py's "full" size) counted on the meta device:
# shapes only, so the 95 TFLOP per image are never computed.
VIT_L = Pass("vit_large_patch14_clip_224", images=8, k=32, power_iters=5,
             layers=("block11", "final"), device="meta")  # fmt: skip


def census(spec: Pass, tangent_rules: bool = True) -> dict[str, Any]:
    """The census of one engine pass of ``spec``; ``tangent_rules`` False runs the engine as it
    was before :mod:`repdiag.encoders.jacobian.tangent_rules` (torch's own linear and layer norm
    rules)."""
    from gpu_paper import build

    from repdiag.encoders.jacobian import rewrites
    from repdiag.encoders.jacobian.engine import jacobian_spectra

    device = torch.device(spec.device)
    taps = build({"name": spec.name, "pooling": "cls", "kwargs": spec.kwargs}, device)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(spec.images, 3, spec.size, spec.size, generator=generator).to(device)
    counter = ByteCensus(spec.tokens)
    with rewrites.tangent_rules_set(tangent_rules), counter:
        jacobian_spectra(
            taps, x, list(spec.layers), method="auto", k=spec.k,
            power_iters=spec.power_iters, seed=0, batch_size=spec.images * spec.k,
            device=device, precision="fp32",
        )  # fmt: skip
    total = sum(counter.bytes.values())
    return {
        "model": {"name": spec.name, "kwargs": spec.kwargs, "layers": list(spec.layers),
                  "tokens": spec.tokens, "device": spec.device},
        "images": spec.images, "k": spec.k, "power_iters": spec.power_iters,
        "tangent_rules": tangent_rules,
        "total_bytes": total,
        "bytes": counter.bytes,
        "fraction": {c: b / total for c, b in counter.bytes.items()},
        "detail": counter.detail,
        "top_ops": dict(sorted(counter.ops.items(), key=lambda kv: -kv[1])[:12]),
    }  # fmt: skip


def side_by_side(spec: Pass) -> dict[str, Any]:
    """The landed engine (torch's rules) and this one on the same pass, in one process."""
    landed, ours = census(spec, tangent_rules=False), census(spec, tangent_rules=True)
    return {"landed": landed, "rules": ours, "ratio": ours["total_bytes"] / landed["total_bytes"]}


def _print(result: dict[str, Any]) -> None:
    landed, ours = result["landed"], result["rules"]
    model = ours["model"]
    print(f"{model['name']} {model['kwargs']} on {model['device']}, taps {model['layers']}, "
          f"{ours['images']} images, k = {ours['k']}, q = {ours['power_iters']}")  # fmt: skip
    print(f"  {'class':14s} {'landed GB':>10s} {'rules GB':>10s}  ratio")
    for kind in CLASSES:
        before, after = landed["bytes"][kind], ours["bytes"][kind]
        ratio = f"{after / before:5.2f}" if before else "    -"
        print(f"  {kind:14s} {before / 1e9:10.3f} {after / 1e9:10.3f}  {ratio}")
    print(f"  {'total':14s} {landed['total_bytes'] / 1e9:10.3f} "
          f"{ours['total_bytes'] / 1e9:10.3f}  {result['ratio']:5.2f}")  # fmt: skip
    for name in ours["detail"]:
        print(f"  (of which {name}: {landed['detail'][name] / 1e9:.3f} -> "
              f"{ours['detail'][name] / 1e9:.3f} GB)")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vit-l", action="store_true",
                        help="the paper's ViT-L/14 pass on the meta device (about 30 s)")  # fmt: skip
    for name, default in (("depth", 4), ("dim", 64), ("size", 64), ("patch", 8), ("images", 2),
                          ("k", 8), ("power-iters", 2)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", type=Path, help="also write the census here")
    args = parser.parse_args(argv)
    spec = VIT_L if args.vit_l else small_vit(
        args.depth, args.dim, args.size, args.patch, images=args.images, k=args.k,
        power_iters=args.power_iters,
    )  # fmt: skip
    result = side_by_side(spec)
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
