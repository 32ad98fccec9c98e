"""Benchmark of the Jacobian-spectra engine against the naive and published protocols.

Runs, on one timm ViT and the same images in one process:

(a) naive: ``torch.autograd.functional.jacobian`` per image per layer, then ``svdvals``;
(b) the published one-direction-at-a-time protocol: randomized subspace iteration with k JVP/VJP
    calls per round per layer in a Python loop (same maths as the engine's randomized mode);
(c) :func:`repdiag.encoders.jacobian.engine.jacobian_spectra` with ``exact``, ``randomized`` and ``auto``, on the
    same model behind the encoder registry's taps (what the workflow differentiates).

Prints wall time per image, peak memory above the baseline (VmHWM on Linux, or CUDA peak), the
ratios, JER agreement, and the fraction of the roofline: FLOPs the method performs (counted with
``torch.utils.flop_counter`` on one image) / wall time, over the float32 matmul rate measured in
the same run. Also measures a plain forward + backward at ``--batch-size`` images as the memory
reference. The FLOP count runs every method once first (a warm-up), then ``--repeats``
interleaved rounds keep each method's best time: on a shared machine other jobs only slow a run
down, and two-thread one-op-at-a-time baselines suffer most. Example (about 4 min on 2 cores):
``.venv/bin/python benchmarks/jacobian.py --images 1 --threads 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from repdiag.core.store import write_text
from repdiag.encoders.jacobian import rewrites
from repdiag.encoders.jacobian.engine import (
    DEFAULT_BATCH_SIZE,
    input_directions,
    jacobian_spectra,
)
from repdiag.encoders.jacobian.jer import jer
from repdiag.encoders.jacobian.rewrites import jacobian_mode


class ViTTaps:
    """A timm ViT with per-block taps (class token of each block, and the normed final token)."""

    def __init__(self, depth: int, width: int, size: int, patch: int, heads: int) -> None:
        import timm

        torch.manual_seed(0)
        self.model = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            img_size=size,
            patch_size=patch,
            embed_dim=width,
            depth=depth,
            num_heads=heads,
            num_classes=0,
        ).eval()
        self.layers = self.all_layers(depth)

    @staticmethod
    def all_layers(depth: int) -> list[str]:
        return [f"block{i:02d}" for i in range(depth)] + ["final"]

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        wanted = set(self.layers if layers is None else layers)
        m, out = self.model, {}
        h = m.norm_pre(m._pos_embed(m.patch_embed(x)))
        depth = len(m.blocks) if "final" in wanted else max(int(name[5:]) for name in wanted) + 1
        for i, block in enumerate(m.blocks[:depth]):  # stop after the deepest tap asked for
            h = block(h)
            if f"block{i:02d}" in wanted:
                out[f"block{i:02d}"] = h[:, 0]
        if "final" in wanted:
            out["final"] = m.norm(h)[:, 0]
        return out


class RegistryTaps:
    """The same timm model behind the encoder registry's taps (:mod:`repdiag.encoders.taps`), as the
    workflow runs it: the engine may then compute a lone block's tap from the class-token rows
    only, and ``final`` by the chain rule from the last block (``derived_taps``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from repdiag.encoders.taps import tap_plan

        self.model, self.plan = model, tap_plan(model, "cls")
        self.layers, self.derived_taps = self.plan.layers, self.plan.derived

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        from repdiag.encoders.taps import run_taps

        return run_taps(self.plan, x, layers)


# ----------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------


def naive_spectra(taps: ViTTaps, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """(a) autograd.functional.jacobian per image per layer, then svdvals."""
    out: dict[str, list[torch.Tensor]] = {name: [] for name in taps.layers}
    for x in images:
        for name in taps.layers:
            jac = torch.autograd.functional.jacobian(
                lambda inp, name=name: taps.layer_outputs(inp[None], [name])[name][0], x
            )
            out[name].append(torch.linalg.svdvals(jac.reshape(jac.shape[0], -1)))
    return {name: torch.stack(values) for name, values in out.items()}


def _orth(columns: list[torch.Tensor]) -> list[torch.Tensor]:
    q, _ = torch.linalg.qr(torch.stack([c.reshape(-1) for c in columns], 1))
    return [q[:, i].reshape(columns[0].shape) for i in range(q.shape[1])]


def loop_spectra(
    taps: ViTTaps, images: torch.Tensor, k: int, q: int, seed: int
) -> dict[str, torch.Tensor]:
    """(b) the published protocol: one JVP or VJP per direction, k per round per layer."""
    omega = input_directions(images[0].numel(), k, seed).to(images)
    out: dict[str, list[torch.Tensor]] = {name: [] for name in taps.layers}
    for x in images:
        x = x[None]
        for name in taps.layers:
            fn = lambda inp, name=name: taps.layer_outputs(inp, [name])[name][0]  # noqa: E731
            _, vjp_fn = torch.func.vjp(fn, x)
            dirs = [omega[i].reshape(x.shape) for i in range(k)]
            ys = _orth([torch.func.jvp(fn, (x,), (v,))[1] for v in dirs])
            for _ in range(q):
                zs = _orth([vjp_fn(y)[0] for y in ys])
                ys = _orth([torch.func.jvp(fn, (x,), (z,))[1] for z in zs])
            b = torch.stack([vjp_fn(y)[0].reshape(-1) for y in ys])
            out[name].append(torch.linalg.svdvals(b))
    return {name: torch.stack(values) for name, values in out.items()}


def plain_forward_backward(taps: ViTTaps, images: torch.Tensor) -> None:
    """Memory reference: one forward and backward over all taps at this batch size."""
    x = images.clone().requires_grad_(True)
    loss = sum(y.sum() for y in taps.layer_outputs(x).values())
    loss.backward()


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _release_free_memory() -> None:
    """Return freed heap pages to the OS so that the next peak RSS counts every allocation."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(fn: Callable[[], object], device: torch.device) -> tuple[object, float, float]:
    """(result, wall seconds, peak memory MiB above the level before the call)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        _release_free_memory()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        base = _rss_kib("VmRSS") * 1024
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _rss_kib("VmHWM") * 1024
    return result, wall, max(peak - base, 0) / 2**20


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the ops ``fn`` dispatches, by ``torch.utils.flop_counter``'s per-op formulas.

    A plain dispatch mode: ``FlopCounterMode``'s module tracker installs backward hooks that
    ``torch.func``'s autograd calls reject, so only its FLOP registry is used.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    registry = FlopCounterMode(display=False).flop_registry

    class Counter(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = registry.get(func._overloadpacket)
            if formula is not None:
                Counter.total += formula(*args, **kwargs, out_val=out)
            return out

    with Counter():
        fn()
    return Counter.total


def matmul_rate(device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """Measured float32 matmul rate (FLOP/s) of a large a @ b on this machine."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--power-iters", type=int, default=5)
    parser.add_argument(
        "--batch-size", type=int, default=0, help="products per pass (0: the engine default)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds (best time)")
    parser.add_argument("--layers", nargs="*", default=None, help="only these taps (default: all)")
    parser.add_argument("--skip", nargs="*", default=[], help="methods to skip: naive loop landed")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser.parse_args(argv)


def benchmark_methods(
    taps: ViTTaps, engine_taps: RegistryTaps, args: argparse.Namespace, bs: int
) -> dict[str, Callable[[torch.Tensor], dict]]:
    """The two baselines and the engine's three methods, each images -> spectra by layer;
    ``--skip`` drops baselines by short name."""
    k, q, seed = args.k, args.power_iters, 0

    def engine(method: str) -> Callable[[torch.Tensor], dict]:
        return lambda x: jacobian_spectra(
            engine_taps,
            x,
            taps.layers,
            method=method,
            k=k,
            power_iters=q,
            seed=seed,
            batch_size=bs,
            precision="fp32",
        )

    def landed(x: torch.Tensor) -> dict:
        """``randomized`` (the method whose JVPs the rules change) with torch's own linear and
        layer norm rules: the engine before repdiag.encoders.jacobian.tangent_rules."""
        with rewrites.tangent_rules_set(False):
            return engine("randomized")(x)

    methods: dict[str, Callable[[torch.Tensor], dict]] = {
        "naive_autograd": lambda x: naive_spectra(taps, x),
        "loop_randomized": lambda x: loop_spectra(taps, x, k, q, seed),
        **{f"engine_{method}": engine(method) for method in ("exact", "randomized", "auto")},
        "engine_randomized_landed": landed,
    }
    skip = {
        "naive": "naive_autograd",
        "loop": "loop_randomized",
        "landed": "engine_randomized_landed",
    }
    for name in args.skip:
        methods.pop(skip.get(name, name), None)
    return methods


def time_methods(methods: dict, images: torch.Tensor, repeats: int, device, rate: float):
    """FLOPs per image (counted on one image) and the best wall time per method over
    interleaved rounds: other jobs on a shared machine only slow a run down, and they hit
    one-op-at-a-time baselines hardest. Returns (rows by method, best matmul rate seen)."""
    rows: dict[str, dict] = {}
    for name, fn in methods.items():
        flops = count_flops(lambda fn=fn: fn(images[:1]))
        rows[name] = {"gflop_per_image": flops / 1e9, "walls": []}
    for round_index in range(repeats):
        for name, fn in methods.items():
            result, wall, mem = measure(lambda fn=fn: fn(images), device)
            row = rows[name]
            row["walls"].append(wall)
            row.setdefault("spectra", result)
            row["peak_mib"] = max(row.get("peak_mib", 0.0), mem)
            print(
                f"  round {round_index + 1} {name:26s} {wall / len(images):8.2f} s/image",
                flush=True,
            )
        rate = max(rate, matmul_rate(device))
    for name, row in rows.items():
        row["s_per_image"] = min(row["walls"]) / len(images)
        row["gflops_achieved"] = row["gflop_per_image"] / row["s_per_image"]
        print(
            f"{name:26s} {row['s_per_image']:8.2f} s/image  peak {row['peak_mib']:7.0f} MiB  "
            f"{row['gflop_per_image']:8.1f} GFLOP/image  {row['gflops_achieved']:6.1f} GFLOP/s"
        )
    print(f"float32 matmul rate (best of all rounds): {rate / 1e9:.0f} GFLOP/s; roofline fraction:")
    for name, row in rows.items():
        row["roofline"] = row["gflops_achieved"] * 1e9 / rate
        print(f"  {name:26s} {row['roofline']:.0%}")
    return rows, rate


def add_jer_errors(rows: dict[str, dict], layers: list[str], k: int) -> None:
    """Each method's largest relative JER error against the exact engine (or the naive loop),
    and the method the engine chose per layer; the spectra leave the rows."""
    all_spectra = {name: row.pop("spectra") for name, row in rows.items()}
    exact_ref = all_spectra.get("engine_exact", all_spectra.get("naive_autograd"))
    for name, row in rows.items():
        spectra = all_spectra[name]
        if exact_ref is not None:
            exact_jer = {layer: jer(exact_ref[layer], top_k=k) for layer in layers}
            row["max_jer_rel_err"] = max(
                ((jer(spectra[layer], top_k=k) - exact_jer[layer]).abs() / exact_jer[layer])
                .max()
                .item()
                for layer in layers
            )
        if hasattr(spectra, "methods"):
            row["methods"] = spectra.methods


def speed_ratios(rows: dict[str, dict], plain_peak_mib: float) -> dict[str, float]:
    """Baseline time over engine time for each pair that ran, and each engine method's peak
    memory over a plain forward and backward pass at the same batch."""
    ratios = {}
    pairs = {
        "exact_speedup_vs_naive": ("naive_autograd", "engine_exact"),
        "randomized_speedup_vs_loop": ("loop_randomized", "engine_randomized"),
        "auto_speedup_vs_naive": ("naive_autograd", "engine_auto"),
        "randomized_speedup_vs_landed_rules": ("engine_randomized_landed", "engine_randomized"),
    }
    for ratio, (baseline, ours) in pairs.items():
        if baseline in rows and ours in rows:
            ratios[ratio] = rows[baseline]["s_per_image"] / rows[ours]["s_per_image"]
    for name in ("engine_exact", "engine_randomized", "engine_auto"):
        if name in rows and plain_peak_mib > 0:
            ratios[f"{name}_peak_vs_plain_fwd_bwd"] = rows[name]["peak_mib"] / plain_peak_mib
    return ratios


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    taps = ViTTaps(args.depth, args.width, args.size, args.patch, args.heads)
    if args.layers:
        taps.layers = [name for name in taps.layers if name in set(args.layers)]
    taps.model.to(device)
    engine_taps = RegistryTaps(taps.model)
    assert engine_taps.layers == ViTTaps.all_layers(args.depth)  # same names, same readouts
    images = torch.randn(
        args.images, 3, args.size, args.size, generator=torch.Generator().manual_seed(1)
    ).to(device)
    bs = args.batch_size or DEFAULT_BATCH_SIZE[device.type]
    rate = matmul_rate(device)
    print(
        f"device {device}, threads {torch.get_num_threads()}, float32 matmul {rate / 1e9:.0f} GFLOP/s"
    )
    print(
        f"model: ViT depth {args.depth} width {args.width} {args.size}px patch {args.patch}; "
        f"{len(taps.layers)} layers; {args.images} images; k={args.k} q={args.power_iters} "
        f"batch_size={bs}"
    )
    methods = benchmark_methods(taps, engine_taps, args, bs)
    with jacobian_mode(taps.model):
        _, fb_wall, fb_mem = measure(
            lambda: plain_forward_backward(taps, images[:1].expand(bs, -1, -1, -1)), device
        )
        print(f"plain forward+backward at batch {bs}: {fb_wall:.2f} s, peak {fb_mem:.0f} MiB")
        rows, rate = time_methods(methods, images, args.repeats, device, rate)
    add_jer_errors(rows, taps.layers, args.k)
    report = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "matmul_gflops": rate / 1e9,
        "plain_fwd_bwd": {"s": fb_wall, "peak_mib": fb_mem, "batch": bs},
        "args": vars(args) | {"json": None},
        **rows,
        "ratios": speed_ratios(rows, fb_mem),
    }
    print(
        "max relative JER error vs exact top-k:",
        {name: f"{row.get('max_jer_rel_err', float('nan')):.2e}" for name, row in rows.items()},
    )
    print("ratios:", {name: round(value, 2) for name, value in report["ratios"].items()})
    if args.json:
        write_text(args.json, json.dumps(report, indent=2, default=str) + "\n")
    return report


if __name__ == "__main__":
    main()
