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


class ByteCensus(TorchDispatchMode):
    """Bytes of the tensor inputs plus outputs of every op run under it, by :func:`op_class`."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.bytes: dict[str, int] = dict.fromkeys(CLASSES, 0)
        self.detail: dict[str, int] = {"gelu": 0, "copies_same_dtype": 0}
        self.ops: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
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


def census(
    depth: int = 2,
    dim: int = 32,
    size: int = 32,
    patch: int = 8,
    images: int = 2,
    k: int = 4,
    power_iters: int = 1,
    layers: list[str] | None = None,
) -> dict[str, Any]:
    """The census of one engine pass (``auto``, float32, CPU) of a ViT of ``depth`` blocks,
    width ``dim``, on ``images`` random images of ``size`` px at ``layers`` (default: the middle
    block and ``final``, as the paper pass on ViT-L)."""
    from gpu_paper import build

    from repdiag.encoders.jacobian.engine import jacobian_spectra

    spec = {"name": "vit_tiny_patch16_224", "pooling": "cls",
            "kwargs": {"img_size": size, "patch_size": patch, "embed_dim": dim, "depth": depth,
                       "num_heads": max(1, dim // 32)}}  # fmt: skip
    device = torch.device("cpu")
    taps = build(spec, device)
    layers = layers or [f"block{depth // 2 - 1:02d}" if depth > 1 else "block00", "final"]
    tokens = (size // patch) ** 2 + 1  # the patches and the class token
    x = torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(7))
    counter = ByteCensus(tokens)
    with counter:
        jacobian_spectra(
            taps, x, layers, method="auto", k=k, power_iters=power_iters, seed=0,
            batch_size=images * k, device=device, precision="fp32",
        )  # fmt: skip
    total = sum(counter.bytes.values())
    return {
        "model": spec | {"layers": layers, "tokens": tokens},
        "images": images, "k": k, "power_iters": power_iters,
        "total_bytes": total,
        "bytes": counter.bytes,
        "fraction": {c: b / total for c, b in counter.bytes.items()},
        "detail": counter.detail,
        "top_ops": dict(sorted(counter.ops.items(), key=lambda kv: -kv[1])[:12]),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("depth", 4), ("dim", 64), ("size", 64), ("patch", 8), ("images", 2),
                          ("k", 8), ("power-iters", 2)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", type=Path, help="also write the census here")
    args = parser.parse_args(argv)
    result = census(args.depth, args.dim, args.size, args.patch, args.images, args.k,
                    args.power_iters)  # fmt: skip
    total = result["total_bytes"]
    print(f"{result['model']['kwargs']}, taps {result['model']['layers']}, "
          f"{result['images']} images, k = {result['k']}, q = {result['power_iters']}: "
          f"{total / 1e9:.3f} GB moved")  # fmt: skip
    for kind in CLASSES:
        print(
            f"  {kind:14s} {result['bytes'][kind] / 1e9:9.3f} GB  {result['fraction'][kind]:6.1%}"
        )
    for name, moved in result["detail"].items():
        print(f"  (of which {name}: {moved / 1e9:.3f} GB)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
