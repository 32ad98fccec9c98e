"""The paper's pass on the GPU benchmark (benchmarks/gpu.py): how long config/paper.yaml's
Jacobian stage takes.

For each model of :data:`PAPER_MODELS` (timm, random weights; ``--tiny``: small stand-ins of
the same architectures) it times one engine call of the paper's pass (8 images, k = 32, q = 5,
``auto``) on the named taps in float32, TF32 and bf16, with

* the FLOPs of the pass from the planner (:func:`repdiag.encoders.jacobian.plan_project.plan_model`:
  products through the network plus QR/SVD), hence TFLOP/s, the fraction of the device's
  datasheet dense peak at that precision (:data:`PEAK_TFLOPS`, H200) and of the matmul rate
  measured in the run;
* the JER (pr, top k) error of TF32 and bf16 against float32, per image and tap, the maximum;
* for the model named ``repeat_on`` in the size: whether two float32 runs are equal bit for bit
  and the cost of deterministic mode (seconds with and without it).

:func:`project` then plans config/paper.yaml's Jacobian stage (``--tiny``: config/test.yaml),
takes for each planned model the measured float32 rate of the benchmarked model nearest to it
in FLOPs per image, and gives its projected hours against the SLURM runtime ``jacobian_spectra`` gives
it (:func:`repdiag.core.slurm.jacobian_runtime`); ``--runtimes`` writes the suggested minutes
(1.5 x projected) to the table that function reads.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import yaml

from repdiag.core import gpu as core_gpu
from repdiag.core.slurm import MARGIN, RUNTIMES_FILE, jacobian_runtime, runtime_minutes
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer
from repdiag.encoders.jacobian.plan_project import plan_config, plan_model

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "tf32", "bf16")
# NVIDIA H200 SXM datasheet, dense (no sparsity), TFLOP/s
PEAK_TFLOPS = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}
PEAK_DEVICE = "NVIDIA H200 (datasheet, dense)"

PAPER_MODELS: dict[str, dict[str, Any]] = {
    "full": {
        "images": 8,
        "k": 32,
        "power_iters": 5,
        "size": 224,
        "config": "config/paper.yaml",
        "repeat_on": "vit_b16",
        "models": {
            "vit_l14": {"name": "vit_large_patch14_clip_224", "kwargs": {}, "pooling": "cls",
                        "layers": ["block11", "final"]},
            "vit_b16": {"name": "vit_base_patch16_224", "kwargs": {}, "pooling": "cls",
                        "layers": ["final"]},
            "convnext_b": {"name": "convnext_base", "kwargs": {}, "pooling": "mean",
                           "layers": ["final"]},
            "resnet50": {"name": "resnet50", "kwargs": {}, "pooling": "mean", "layers": ["final"]},
        },
    },
    "tiny": {
        "images": 2,
        "k": 4,
        "power_iters": 1,
        "size": 32,
        "config": "config/test.yaml",
        "repeat_on": "vit_b16",
        "models": {
            "vit_l14": {"name": "vit_tiny_patch16_224", "pooling": "cls",
                        "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 4,
                                   "num_heads": 2},
                        "layers": ["block01", "final"]},
            "vit_b16": {"name": "vit_tiny_patch16_224", "pooling": "cls",
                        "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2,
                                   "num_heads": 2},
                        "layers": ["final"]},
            "convnext_b": {"name": "convnext_atto", "kwargs": {}, "pooling": "mean",
                           "layers": ["final"]},
            "resnet50": {"name": "resnet10t", "pooling": "mean",
                         "kwargs": {"channels": [8, 16, 16, 32], "stem_width": 8},
                         "layers": ["final"]},
        },
    },
}  # fmt: skip


class Taps:
    """A timm model behind the encoder registry's taps, with the workflow's pooling."""

    def __init__(self, model: torch.nn.Module, pooling: str) -> None:
        from repdiag.encoders.taps import tap_plan

        self.model, self.plan = model, tap_plan(model, pooling)
        self.layers = self.plan.layers

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        from repdiag.encoders.taps import run_taps

        return run_taps(self.plan, x, layers)


def build(spec: dict[str, Any], device: torch.device) -> Taps:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(spec["name"], pretrained=False, num_classes=0, **spec["kwargs"])
    return Taps(model.eval().requires_grad_(False).to(device), spec["pooling"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _call(taps: Taps, x: torch.Tensor, layers, size: dict, device, precision: str):
    """(spectra, wall seconds) of one engine call of the paper's pass."""
    _sync(device)
    start = time.perf_counter()
    spectra = jacobian_spectra(
        taps, x, layers, method="auto", k=size["k"], power_iters=size["power_iters"], seed=0,
        batch_size=len(x) * size["k"], device=device, precision=precision,
    )  # fmt: skip
    _sync(device)
    return spectra, time.perf_counter() - start


def max_jer_error(spectra: dict, reference: dict, k: int) -> float:
    """Largest relative JER (pr, top k) difference over images and taps."""
    worst = 0.0
    for layer, values in reference.items():
        want = jer(values.double(), top_k=k)
        got = jer(spectra[layer].double(), top_k=k)
        worst = max(worst, float(((got - want).abs() / want).max()))
    return worst


def pass_flops(taps: Taps, size: dict, layers: list[str]) -> tuple[float, float]:
    """The planner's FLOPs of the pass (network products plus QR/SVD): over its images, and
    per image."""
    batch = size["images"] * size["k"]
    plan = plan_model(
        taps, (3, size["size"], size["size"]), method="auto", k=size["k"],
        power_iters=size["power_iters"], batch_size=batch, chunk_size=size["images"],
        images=size["images"], layers=layers,
    )  # fmt: skip
    return plan.total_flops, plan.flops_per_image + plan.linalg_per_image


def measure_model(name: str, taps: Taps, spec: dict, size: dict, device, matmul: dict, x):
    """One model's pass in each precision: seconds, rates, fractions and JER errors."""
    flops, per_image = pass_flops(taps, size, spec["layers"])
    _call(taps, x[:1], spec["layers"], size, device, "fp32")  # warm-up
    row: dict[str, Any] = {
        "model": spec["name"], "layers": spec["layers"],
        "images": len(x), "tflop": flops / 1e12, "tflop_per_image": per_image / 1e12,
    }  # fmt: skip
    reference = None
    for precision in PRECISIONS:
        try:
            spectra, wall = _call(taps, x, spec["layers"], size, device, precision)
        except RuntimeError as err:  # recorded, not fatal: the other precisions and models run
            row[precision] = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
            if precision == "fp32":
                return row
            continue
        tflops = flops / wall / 1e12
        row[precision] = {
            "s": wall,
            "tflops": tflops,
            "fraction_of_peak": tflops / PEAK_TFLOPS[precision],
            "fraction_of_matmul": tflops / matmul[precision]["tflops"],
            "methods": dict(spectra.methods),
        }
        if reference is None:
            reference = spectra
        row[precision]["max_rel_jer_error_vs_fp32"] = max_jer_error(spectra, reference, size["k"])
    if name == size["repeat_on"]:
        row["repeatability"] = repeatability(taps, x, spec["layers"], size, device, reference)
    return row


def repeatability(taps: Taps, x, layers, size: dict, device, first: dict) -> dict[str, Any]:
    """A second deterministic float32 run (bit-for-bit equal to the first?) and one with
    deterministic algorithms off: the cost of deterministic mode."""
    again, deterministic_s = _call(taps, x, layers, size, device, "fp32")
    free = functools.partial(core_gpu.numerics, deterministic=False)
    with mock.patch.object(core_gpu, "numerics", free):
        _, free_s = _call(taps, x, layers, size, device, "fp32")
    return {
        "bitwise_equal": all(torch.equal(first[n], again[n]) for n in first),
        "deterministic_s": deterministic_s,
        "nondeterministic_s": free_s,
        "deterministic_cost": deterministic_s / free_s - 1.0,
    }


def slurm_runtime_minutes(model: str) -> int:
    """The SLURM runtime ``jacobian_spectra`` gives ``model`` now (first attempt)."""
    return jacobian_runtime(model, 1, ROOT / RUNTIMES_FILE)


def write_runtimes(projection: dict[str, Any], path: Path) -> None:
    """The per-model runtime table the rule reads (:func:`repdiag.core.slurm.jacobian_runtime`)."""
    table = {key: m["runtime_min_suggested"] for key, m in projection["models"].items()}
    header = (
        "# SLURM minutes per model of jacobian_spectra, written by benchmarks/gpu.sh --runtimes:\n"
        f"# the planner's FLOPs of {projection['config']} at the FP32 rates measured on "
        f"{projection.get('device_name', 'this device')}, times {MARGIN}\n"
    )
    path.write_text(header + yaml.safe_dump(table, sort_keys=True))


def stage_plan(size: dict):
    """The planner's plan of the size's config (FLOPs only: the rate is the benchmark's)."""
    from repdiag.core.config import load_config

    return plan_config(load_config(ROOT / size["config"]), rate=1.0, device="cuda")


def project(rows: dict[str, dict], size: dict, plan) -> dict[str, Any]:
    """Projected hours of the config's Jacobian stage (``plan``: :func:`stage_plan`): each
    planned model at the measured float32 rate of the benchmarked model nearest to it in FLOPs
    per image."""
    measured = {name: r for name, r in rows.items() if "tflops" in r.get("fp32", {})}
    models, total_h = {}, 0.0
    for model in plan.models:
        per_image = model.flops_per_image + model.linalg_per_image
        near = min(measured, key=lambda n: abs(measured[n]["tflop_per_image"] * 1e12 - per_image))
        hours = model.total_flops / (measured[near]["fp32"]["tflops"] * 1e12) / 3600
        total_h += hours
        models[model.key] = {
            "pflop": model.total_flops / 1e15,
            "rate_from": near,
            "hours": hours,
            "slurm_runtime_min": slurm_runtime_minutes(model.key),
            "fits_runtime": hours * 60 <= slurm_runtime_minutes(model.key),
            "runtime_min_suggested": runtime_minutes(hours),
        }
    return {
        "config": size["config"],
        "images_per_model": plan.settings["images"],
        "stage_pflop": plan.total_flops / 1e15,
        "stage_hours": total_h,
        "models": models,
        "skipped": plan.skipped,
    }


def paper_pass(report: dict, save, budget, size_name: str, device: torch.device) -> None:
    """Fill ``report["paper_pass"]`` model by model and ``report["projection"]``; a model whose
    estimate (its planned TFLOP at the previous model's seconds per TFLOP, four calls) does
    not fit the budget is skipped (an unbounded budget, the tiny run's, skips nothing)."""
    size = PAPER_MODELS[size_name]
    x_all = torch.randn(size["images"], 3, size["size"], size["size"],
                        generator=torch.Generator().manual_seed(7)).to(device)  # fmt: skip
    rows: dict[str, dict] = report["paper_pass"]
    report["peak_tflops"] = {"device": PEAK_DEVICE, **PEAK_TFLOPS}
    plan = stage_plan(size)  # first: a run cut short still projects from what it measured
    seconds_per_tflop = 0.0
    for name, spec in size["models"].items():
        taps = build(spec, device)
        tflop = pass_flops(taps, size, spec["layers"])[0] / 1e12
        if not budget.allows(4 * seconds_per_tflop * tflop):
            report["skipped"].append(f"paper pass {name}")
            continue
        rows[name] = measure_model(name, taps, spec, size, device, report["matmul"], x_all)
        if "s" in rows[name]["fp32"]:
            seconds_per_tflop = rows[name]["fp32"]["s"] / max(rows[name]["tflop"], 1e-12)
            report["projection"] = project(rows, size, plan)  # refined after every model
        save()
