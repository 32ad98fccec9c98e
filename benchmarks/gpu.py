"""GPU benchmark of the Jacobian engine (run through ``benchmarks/gpu.sh``; at most 8 minutes).

On one device (default: CUDA when visible, else CPU), in one process, it measures:

* ``matmul``: the device's matmul rate at n >= 8192 in FP32 (IEEE), TF32 and BF16 (TFLOP/s);
* ``paper_pass`` and ``projection`` (benchmarks/gpu_paper.py, first, as the question the run
  answers): the paper's pass (8 images, k = 32, q = 5) on ViT-L/14 (``final`` and a middle
  block), ViT-B/16, ConvNeXt-B and ResNet-50 in FP32, TF32 and BF16 with each one's JER error
  against FP32, the fraction of the H200's datasheet dense peak (``peak_tflops``) and of the
  measured matmul rate, bit-for-bit repeatability and the cost of deterministic mode; then the
  projected hours of config/paper.yaml's Jacobian stage, per model against its SLURM runtime;
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
cannot rot), with no budget unless ``--budget-s`` sets one: every step runs however slow the
machine. Example on a GPU machine: ``benchmarks/gpu.sh --json results/benchmarks/gpu.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_paper import paper_pass, write_runtimes  # benchmarks/gpu_paper.py
from gpu_steps import (  # benchmarks/gpu_steps.py
    Budget,
    Fallbacks,
    Steps,
    count_method_flops,
    measure_other_encoder,
    measure_precisions,
    measure_repeatability,
    measure_throughput,
    probe_images,
    products_per_pass,
    sync,
    vit,
)
from jacobian import RegistryTaps  # benchmarks/jacobian.py

from repdiag.core.gpu import effective_precision, numerics
from repdiag.core.store import write_text
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer

__all__ = ["main", "matmul_tflops", "products_per_pass"]

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
        "budget_s": 440.0,
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
        "budget_s": None,  # unbounded: the tests check what ran, never how fast
    },
}


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
            sync(device)
            start = time.perf_counter()
            a @ b
            sync(device)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: seconds on a CPU")
    parser.add_argument("--device", default=None, help="default: cuda when visible, else cpu")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=None)
    parser.add_argument(
        "--images", type=int, default=0, help="images per throughput run (0: 2 exact, 4 others)"
    )
    parser.add_argument(
        "--runtimes",
        type=Path,
        default=None,
        help="write the per-model SLURM runtimes (e.g. profiles/slurm/jacobian_runtimes.yaml)",
    )
    parser.add_argument("--reference-threads", type=int, default=0, help="0: all cores but 2")
    parser.add_argument("--reference-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size-name", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.size_name = args.size_name or ("tiny" if args.tiny else "full")
    return args


def new_report(size_name: str, size: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The report's fields, empty until each step fills its own."""
    return {
        "mode": size_name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": size["vit"]["name"],
        "image_size": size["size"],
        "k": size["k"],
        "power_iters": size["power_iters"],
        "matmul": {},
        "flops": {},
        "throughput": [],
        "accuracy": {},
        "repeatable": {},
        "other_encoder": {},
        "paper_pass": {},
        "peak_tflops": {},
        "projection": {},
        "vmap_fallbacks": [],
        "skipped": [],
        "effective_precision": {p: effective_precision(p, device) for p in PRECISIONS},
    }


def start_reference(args: argparse.Namespace, out: Path) -> subprocess.Popen:
    """The float64 CPU reference in its own process, alongside the device's runs; its stderr
    goes to reference.log beside ``out``."""
    threads = args.reference_threads or max(1, (os.cpu_count() or 2) - 2)
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    with open(out.with_name("reference.log"), "wb") as log:  # the child keeps its own handle
        return subprocess.Popen(
            [
                *(sys.executable, __file__, "--reference-out", str(out)),
                *("--size-name", args.size_name, "--reference-threads", str(threads)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.reference_out is not None:  # the float64 CPU reference subprocess
        run_reference(args)
        return {}
    size = copy.deepcopy(SIZES[args.size_name])
    if args.images:
        size["images"] = dict.fromkeys(size["images"], args.images)
    budget = Budget(args.budget_s or size["budget_s"])
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report = new_report(args.size_name, size, device)
    fallbacks = Fallbacks()

    def save() -> None:
        report["vmap_fallbacks"] = sorted(fallbacks.ops)
        report["elapsed_s"] = round(budget.used, 2)
        if args.json:
            write_text(args.json, json.dumps(report, indent=2, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="repdiag-gpu-bench-") as tmp:
        reference_out = Path(tmp) / "reference.pt"
        reference = start_reference(args, reference_out)
        try:
            for precision in PRECISIONS:
                n = size["matmul_n"]
                report["matmul"][precision] = {
                    "n": n,
                    "tflops": matmul_tflops(device, n, precision),
                }
            save()
            paper_pass(report, save, budget, args.size_name, device)
            on_device = _accuracy_on_device(fallbacks, device, size)
            steps = Steps(report, save, budget, fallbacks, device, size)
            count_method_flops(steps)
            measure_throughput(steps, args.batch_sizes or size["batch_sizes"])
            measure_precisions(steps)
            measure_repeatability(steps)
            measure_other_encoder(steps)
            _accuracy(report, save, budget, size, on_device, reference, reference_out)
        except KeyboardInterrupt:  # gpu.sh's timeout: keep what was measured
            report["skipped"].append("interrupted (time limit)")
        finally:
            if reference.poll() is None:
                reference.kill()
            reference.wait()
            save()
    if args.runtimes and report["projection"]:
        write_runtimes(
            {**report["projection"], "device_name": report["device_name"]}, args.runtimes
        )
    print(json.dumps({key: report[key] for key in report if key != "throughput"}, default=str))
    print(projection_text(report))
    for row in report["throughput"]:
        print(json.dumps(row, default=str))
    return report


def projection_text(report: dict[str, Any]) -> str:
    """One line: the projected hours of the config's Jacobian stage and the models over their
    SLURM runtime."""
    projection = report.get("projection") or {}
    if not projection:
        return "projection: none (no model of the paper pass was measured)"
    over = sorted(k for k, m in projection["models"].items() if not m["fits_runtime"])
    return (
        f"projection: {projection['config']} Jacobian stage {projection['stage_pflop']:.3g} PFLOP, "
        f"{projection['stage_hours']:.3g} h at the measured FP32 rates; over the SLURM runtime: "
        f"{', '.join(over) or 'none'}"
    )


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
    left = budget.left()
    left = None if left is None else max(5.0, left)
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
