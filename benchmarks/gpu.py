"""GPU benchmark of the Jacobian engine (run through ``benchmarks/gpu.sh``; at most 5 minutes).

On one device (default: CUDA when visible, else CPU), in one process, it measures:

* ``matmul``: the device's matmul rate at n >= 8192 in FP32 (IEEE), TF32 and BF16 (TFLOP/s);
* ``throughput``: images per second of ViT-B/16 at 224 px (timm ``vit_base_patch16_224``,
  random weights) over all 13 taps for ``exact``, ``randomized`` and ``auto`` (k = 32, q = 5) at
  Jacobian-vector-product batch sizes 256-2048, with peak memory, FLOPs per image (counted with
  ``torch.utils.flop_counter`` on one image) and the fraction of the matmul rate reached; ``auto``
  also in TF32 and BF16. A run whose work equals an earlier one (same method per layer and the
  same products per pass: a randomized pass holds at most images x k products) is not repeated
  (``same_as``);
* ``accuracy``: JER of the device's FP32, TF32 and BF16 against CPU float64 on the same images
  and taps (the CPU reference runs in a subprocess alongside);
* ``repeatable``: whether two FP32 runs on the same images are equal bit for bit;
* ``other_encoder``: an open_clip ViT-B/32 (random weights), whose taps take neither the
  class-token nor the chain-rule shortcut: images per second and the methods used;
* ``vmap_fallbacks``: ops that ran without a batching rule (torch's per-sample loop).

Each step is skipped (and listed in ``skipped``) when its estimated time would overrun
``--budget-s``; the JSON (``--json``) is rewritten after every step, so a killed run keeps what
it measured. A randomized pass holds at most images x k products, so the default 4 images fill
128 of a batch; ``--images 64 --budget-s 3000`` (with ``REPDIAG_GPU_BENCH_TIMEOUT_S=3100`` for
gpu.sh) fills 2048, a longer run than the 5-minute check. ``--tiny``: a 2-block width-32 ViT at
32 px, two images, small matmuls: seconds on a CPU (what the tests run so that this script
cannot rot). Example on a GPU machine: ``benchmarks/gpu.sh --json results/benchmarks/gpu.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jacobian import RegistryTaps, count_flops, measure  # benchmarks/jacobian.py

from repdiag.core.gpu import effective_precision, numerics
from repdiag.core.store import write_text
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer

PRECISIONS = ("fp32", "tf32", "bf16")
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "vit": {"name": "vit_base_patch16_224", "kwargs": {}},
        "size": 224,
        "open_clip": {"name": "ViT-B-32"},
        "batch_sizes": [256, 512, 1024, 2048],
        "images": {"exact": 2, "randomized": 4, "auto": 4},
        "k": 32,
        "power_iters": 5,
        "matmul_n": 8192,
        # the float64 CPU reference: a few taps at shallow-to-full depth, fewer directions
        "reference": {"layers": ["block00", "block05", "block11"], "k": 16, "power_iters": 2},
        "budget_s": 240.0,
    },
    "tiny": {
        "vit": {
            "name": "vit_tiny_patch16_224",
            "kwargs": {
                "img_size": 32,
                "patch_size": 8,
                "embed_dim": 32,
                "depth": 2,
                "num_heads": 2,
            },
        },
        "size": 32,
        "open_clip": {"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "heads": 2},
        "batch_sizes": [16, 64],
        "images": {"exact": 2, "randomized": 2, "auto": 2},
        "k": 4,
        "power_iters": 1,
        "matmul_n": 256,
        "reference": {"layers": None, "k": 4, "power_iters": 1},
        "budget_s": 120.0,
    },
}


class Budget:
    """Wall-clock budget: a step runs only when its estimate fits in what is left."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, time.monotonic()

    @property
    def used(self) -> float:
        return time.monotonic() - self.start

    def allows(self, estimate_s: float) -> bool:
        return self.used + estimate_s <= self.seconds


def vit(size: dict[str, Any]) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    spec = size["vit"]
    return timm.create_model(spec["name"], pretrained=False, num_classes=0, **spec["kwargs"]).eval()


def open_clip_visual(size: dict[str, Any]) -> torch.nn.Module:
    import open_clip
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(1)
    spec = size["open_clip"]
    if "name" in spec:
        return open_clip.create_model(spec["name"], pretrained=None).visual.eval()
    return VisionTransformer(mlp_ratio=2.0, output_dim=16, **spec).eval()


def probe_images(n: int, size: int) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(7))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def matmul_tflops(device: torch.device, n: int, precision: str, repeats: int = 5) -> float:
    """Best-of-``repeats`` rate of an n x n float32 matmul (``bf16``: bfloat16 operands)."""
    with numerics(precision, device):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        generator = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, generator=generator).to(dtype)
        b = torch.randn(n, n, device=device, generator=generator).to(dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            a @ b
            _sync(device)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def products_per_pass(method_of: dict[str, str], d_out: dict[str, int], n: int, k: int, bs: int):
    """Jacobian-vector products in the engine's largest vmapped call (see jacobian_spectra)."""
    widest = {"exact": 0, "randomized": 0}
    for layer, method in method_of.items():
        if method == "exact":
            per_pass = max(1, bs // d_out[layer])
            widest["exact"] = max(widest["exact"], min(bs, min(per_pass, n) * d_out[layer]))
        else:
            widest["randomized"] = max(widest["randomized"], min(bs, min(bs // k or 1, n) * k))
    return widest


class Fallbacks:
    """Collects torch's "no batching rule" warnings (the per-sample vmap fallback) by op."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        torch._C._functorch._set_vmap_fallback_warning_enabled(True)

    def run(self, fn: Callable[[], Any]) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
        for warning in caught:
            text = str(warning.message)
            if "batching rule" in text:
                self.ops.add(text.split("batching rule for ")[-1].split(".")[0])
        return result


def run_reference(args: argparse.Namespace) -> None:
    """Subprocess: float64 CPU spectra of the reference taps, saved with torch.save."""
    size = SIZES[args.size_name]
    torch.set_num_threads(max(1, args.reference_threads))
    model = vit(size).double()
    ref = size["reference"]
    taps = RegistryTaps(model)
    layers = ref["layers"] or taps.layers
    x = probe_images(1, size["size"]).double()
    spectra = {}
    for layer in layers:  # shallow first: a killed reference keeps its finished taps
        s = jacobian_spectra(
            taps,
            x,
            [layer],
            method="auto",
            k=ref["k"],
            power_iters=ref["power_iters"],
            seed=0,
            device="cpu",
            precision="fp32",
        )
        spectra[layer] = s[layer]
        torch.save(spectra, args.reference_out)


def _estimate(per_image: dict[str, float], method: str, n: int, precision: str) -> float:
    scale = {"fp32": 1.0, "tf32": 0.6, "bf16": 0.6}[precision]
    return per_image.get(method, 0.0) * n * scale


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: seconds on a CPU")
    parser.add_argument("--device", default=None, help="default: cuda when visible, else cpu")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=None)
    parser.add_argument(
        "--images", type=int, default=0, help="images per throughput run (0: 2 exact, 4 others)"
    )
    parser.add_argument("--reference-threads", type=int, default=0, help="0: all cores but 2")
    parser.add_argument("--reference-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size-name", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.size_name = args.size_name or ("tiny" if args.tiny else "full")
    if args.reference_out is not None:  # the float64 CPU reference subprocess
        run_reference(args)
        return {}
    size = copy.deepcopy(SIZES[args.size_name])
    if args.images:
        size["images"] = dict.fromkeys(size["images"], args.images)
    budget = Budget(args.budget_s or size["budget_s"])
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    k, q = size["k"], size["power_iters"]
    batch_sizes = args.batch_sizes or size["batch_sizes"]
    report: dict[str, Any] = {
        "mode": args.size_name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": size["vit"]["name"],
        "image_size": size["size"],
        "k": k,
        "power_iters": q,
        "matmul": {},
        "flops": {},
        "throughput": [],
        "accuracy": {},
        "repeatable": {},
        "other_encoder": {},
        "vmap_fallbacks": [],
        "skipped": [],
        "effective_precision": {p: effective_precision(p, device) for p in PRECISIONS},
    }
    fallbacks = Fallbacks()

    def save() -> None:
        report["vmap_fallbacks"] = sorted(fallbacks.ops)
        report["elapsed_s"] = round(budget.used, 2)
        if args.json:
            write_text(args.json, json.dumps(report, indent=2, default=str) + "\n")

    # the float64 CPU reference runs alongside in its own process
    tmp = Path(tempfile.mkdtemp(prefix="repdiag-gpu-bench-"))
    reference_out = tmp / "reference.pt"
    threads = args.reference_threads or max(1, (os.cpu_count() or 2) - 2)
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    log = open(tmp / "reference.log", "wb")  # closed with the process
    reference = subprocess.Popen(
        [
            *(sys.executable, __file__, "--reference-out", str(reference_out)),
            *("--size-name", args.size_name, "--reference-threads", str(threads)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    try:
        for precision in PRECISIONS:
            report["matmul"][precision] = {
                "n": size["matmul_n"],
                "tflops": matmul_tflops(device, size["matmul_n"], precision),
            }
        save()
        on_device = _accuracy_on_device(fallbacks, device, size)
        _measure_all(report, save, budget, fallbacks, device, size, batch_sizes, k, q)
        _accuracy(report, save, budget, size, on_device, reference, reference_out)
    except KeyboardInterrupt:  # gpu.sh's timeout: keep what was measured
        report["skipped"].append("interrupted (time limit)")
    finally:
        if reference.poll() is None:
            reference.kill()
        reference.wait()
        log.close()
        save()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({key: report[key] for key in report if key != "throughput"}, default=str))
    for row in report["throughput"]:
        print(json.dumps(row, default=str))
    return report


def _measure_all(report, save, budget, fallbacks, device, size, batch_sizes, k, q) -> None:
    model = vit(size).to(device)
    taps = RegistryTaps(model)
    n_max = max(size["images"].values())
    x = probe_images(n_max, size["size"]).to(device)

    def engine(method: str, n: int, bs: int | None, precision: str = "fp32"):
        return jacobian_spectra(
            taps,
            x[:n],
            method=method,
            k=k,
            power_iters=q,
            seed=0,
            batch_size=bs,
            device=device,
            precision=precision,
        )

    # FLOPs per image of each method, counted on one image (also the warm-up), and a first
    # estimate of seconds per image for the budget
    per_image: dict[str, float] = {}
    methods_of: dict[str, dict[str, str]] = {}
    for method in ("exact", "randomized", "auto"):
        if per_image and not budget.allows(max(per_image.values()) * 1.5):
            report["skipped"].append(f"flop count {method}")
            continue
        start = time.perf_counter()
        captured: dict[str, Any] = {}

        def counted(method: str = method, captured: dict = captured) -> None:
            captured["s"] = fallbacks.run(lambda: engine(method, 1, None))

        flops = count_flops(counted)
        _sync(device)
        per_image[method] = time.perf_counter() - start
        methods_of[method] = dict(captured["s"].methods)
        report["flops"][method] = {
            "tflop_per_image": flops / 1e12,
            "methods": methods_of[method],
            "d_out": dict(captured["s"].d_out),
        }
        save()

    done: dict[tuple, dict[str, Any]] = {}
    plan = [
        (method, bs, "fp32") for method in ("auto", "exact", "randomized") for bs in batch_sizes
    ]
    for method, bs, precision in plan:
        if method not in methods_of:
            continue
        n = size["images"][method]
        d_out = report["flops"][method]["d_out"]
        per_pass = products_per_pass(methods_of[method], d_out, n, k, bs)
        key = (json.dumps(methods_of[method], sort_keys=True), json.dumps(per_pass), precision, n)
        row = {
            "method": method,
            "precision": precision,
            "batch_size": bs,
            "images": n,
            "products_per_pass": per_pass,
        }
        if key in done:
            row |= {f: done[key][f] for f in ("images_per_s", "peak_mib", "fraction_of_matmul")}
            row["same_as"] = {f: done[key][f] for f in ("method", "batch_size")}
            report["throughput"].append(row)
            continue
        estimate = _estimate(per_image, method, n, precision)
        if not budget.allows(estimate):
            report["skipped"].append(f"throughput {method} batch {bs} ({estimate:.0f} s)")
            continue
        try:
            _, wall, peak = measure(
                lambda m=method, n=n, bs=bs: fallbacks.run(lambda: engine(m, n, bs)), device
            )
        except torch.OutOfMemoryError:
            _free(device)
            report["skipped"].append(f"throughput {method} batch {bs} (out of memory)")
            save()
            continue
        per_image[method] = wall / n
        tflop = report["flops"][method]["tflop_per_image"]
        rate = report["matmul"][precision]["tflops"]
        row |= {
            "s": wall,
            "images_per_s": n / wall,
            "peak_mib": peak,
            "tflops": tflop * n / wall,
            "fraction_of_matmul": tflop * n / wall / rate,
        }
        done[key] = row
        report["throughput"].append(row)
        save()

    # auto in TF32 and BF16 at the fastest FP32 batch size
    auto_rows = [r for r in report["throughput"] if r["method"] == "auto" and "s" in r]
    if auto_rows:
        best = max(auto_rows, key=lambda r: r["images_per_s"])
        for precision in ("tf32", "bf16"):
            n = best["images"]
            estimate = _estimate(per_image, "auto", n, precision)
            if not budget.allows(estimate):
                report["skipped"].append(f"throughput auto {precision} ({estimate:.0f} s)")
                continue
            _, wall, peak = measure(
                lambda p=precision, n=n: fallbacks.run(
                    lambda: engine("auto", n, best["batch_size"], p)
                ),
                device,
            )
            tflop = report["flops"]["auto"]["tflop_per_image"]
            report["throughput"].append(
                {
                    "method": "auto",
                    "precision": precision,
                    "batch_size": best["batch_size"],
                    "images": n,
                    "s": wall,
                    "images_per_s": n / wall,
                    "peak_mib": peak,
                    "tflops": tflop * n / wall,
                    "fraction_of_matmul": tflop * n / wall / report["matmul"][precision]["tflops"],
                }
            )
            save()

    # bitwise repeatability: the same FP32 run twice
    for precision in ("fp32", "tf32"):
        estimate = 2 * _estimate(per_image, "auto", 1, precision)
        if not budget.allows(estimate):
            report["skipped"].append(f"repeatability {precision}")
            continue
        first = engine("auto", 1, None, precision)
        second = engine("auto", 1, None, precision)
        report["repeatable"][precision] = all(
            torch.equal(first[name], second[name]) for name in first
        )
        save()

    # an encoder without the shortcuts: open_clip's ViT (no class-token block, no derived taps)
    other = open_clip_visual(size).to(device)
    other_taps = RegistryTaps(other)
    estimate = _estimate(per_image, "auto", 2, "fp32") / 2
    if other_taps.derived_taps or any(t.pooled_forward for t in other_taps.plan.blocks):
        report["other_encoder"]["error"] = "expected no shortcuts"
    if budget.allows(estimate):
        xo = probe_images(2, size["size"]).to(device)
        _, wall, peak = measure(
            lambda: report["other_encoder"].update(
                spectra=fallbacks.run(
                    lambda: jacobian_spectra(
                        other_taps,
                        xo,
                        method="auto",
                        k=k,
                        power_iters=q,
                        seed=0,
                        device=device,
                        precision="fp32",
                    )
                )
            ),
            device,
        )
        spectra = report["other_encoder"].pop("spectra")
        report["other_encoder"] |= {
            "model": size["open_clip"].get("name", "open_clip VisionTransformer (tiny)"),
            "layers": len(other_taps.layers),
            "derived_taps": sorted(other_taps.derived_taps),
            "methods": dict(spectra.methods),
            "images": 2,
            "images_per_s": 2 / wall,
            "peak_mib": peak,
        }
    else:
        report["skipped"].append("other encoder")
    save()


def _accuracy_on_device(fallbacks, device, size) -> dict[str, Any]:
    """The reference taps' spectra on the device in FP32, TF32 and BF16 (same image, settings)."""
    ref = size["reference"]
    taps = RegistryTaps(vit(size).to(device))
    layers = ref["layers"] or taps.layers
    x = probe_images(1, size["size"]).to(device)
    return {
        precision: fallbacks.run(
            lambda p=precision: jacobian_spectra(
                taps,
                x,
                layers,
                method="auto",
                k=ref["k"],
                power_iters=ref["power_iters"],
                seed=0,
                device=device,
                precision=p,
            )
        )
        for precision in PRECISIONS
    }


def _accuracy(report, save, budget, size, device_spectra, reference, reference_out) -> None:
    """JER (pr, top k) of the device's FP32/TF32/BF16 against the CPU float64 reference."""
    ref = size["reference"]
    left = max(5.0, budget.seconds - budget.used)
    try:
        reference.wait(timeout=left)
    except subprocess.TimeoutExpired:
        reference.kill()
        report["skipped"].append("part of the float64 reference (time)")
    if not reference_out.is_file():
        log = reference_out.with_name("reference.log")
        error = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
        report["accuracy"]["error"] = f"no float64 reference: {error}"
        return
    cpu64 = torch.load(reference_out)
    report["accuracy"] = {
        "reference": "cpu float64",
        "images": 1,
        "k": ref["k"],
        "power_iters": ref["power_iters"],
        "layers": list(cpu64),
    }
    for precision, spectra in device_spectra.items():
        errors = {}
        for layer, s64 in cpu64.items():
            want = jer(s64, top_k=ref["k"])
            got = jer(spectra[layer].double(), top_k=ref["k"])
            errors[layer] = float(((got - want).abs() / want).max())
        report["accuracy"][precision] = {
            "max_rel_jer_error": max(errors.values()),
            "per_layer": errors,
        }
    save()


if __name__ == "__main__":
    main()
