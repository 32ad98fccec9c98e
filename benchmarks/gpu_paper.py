"""The paper's pass on the GPU benchmark (benchmarks/gpu.py): how long config/paper.yaml's
Jacobian stage takes.

For each model of :data:`PAPER_MODELS` (timm, random weights; ``--tiny``: small stand-ins of
the same architectures) it times one engine call of the paper's pass (8 images, k = 32, q = 5,
``auto``) on the named taps in float32, TF32 and bf16, with

* the FLOPs of the pass from the planner (:func:`repdiag.encoders.jacobian.plan_costs.plan_model`:
  products through the network plus QR/SVD), hence TFLOP/s, the fraction of the device's
  datasheet dense peak at that precision (:data:`PEAK_TFLOPS`, H200) and of the matmul rate
  measured in the run;
* the JER (pr, top k) error of TF32 and bf16 against float32, per image and tap, the maximum;
* for the model named ``repeat_on`` in the size: whether two float32 runs are equal bit for bit
  and the cost of deterministic mode (seconds with and without it).

:func:`project` then plans config/paper.yaml's Jacobian stage (``--tiny``: config/test.yaml)
and gives each planned model the rates measured on its own architecture (:func:`architecture`:
ViT-L, ViT-S/B, ConvNeXt, ResNet; never another architecture's), from the measurement whose
taps are closest to the planned model's: the all-tap ViT-B/16 run of benchmarks/gpu.py
(``throughput``) where the report has it, else the paper pass's one- or two-tap run. Its
projected hours at FP32, TF32 and BF16, and at FP32 against the SLURM runtime
``jacobian_spectra`` gives it (:func:`repdiag.core.slurm.jacobian_runtime`); ``--runtimes``
writes the suggested minutes (1.5 x projected at FP32) to the table that function reads.

Offline, from a report benchmarks/gpu.sh wrote (the FLOPs its projection stored, or with
``--replan`` the config planned again here), the same projection:

    .venv/bin/python benchmarks/gpu_paper.py benchmarks/measured/gpu-h200.json [--replan]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
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
from repdiag.encoders.jacobian.plan_costs import plan_model
from repdiag.encoders.jacobian.plan_project import plan_config

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
    from repdiag.api import load_config

    return plan_config(load_config(ROOT / size["config"]), rate=1.0, device="cuda")


# The architecture each benchmarked model of PAPER_MODELS stands for (its --tiny stand-in too)
BENCHMARK_ARCHITECTURE = {
    "vit_l14": "ViT-L", "vit_b16": "ViT-S/B", "convnext_b": "ConvNeXt", "resnet50": "ResNet",
}  # fmt: skip
# A model's architecture from its name (timm, open_clip, hub or torchvision id), first match:
# ViT-S and ViT-B (BEiT, EVA02-B, SigLIP B included) share the ViT-B/16 rates, every ResNet-50
# variant (x2 width, CLIP's RN50) ResNet-50's
ARCHITECTURE_PATTERNS = (
    ("ViT-L", re.compile(r"vit_large|vit-l-|eva02-l-", re.IGNORECASE)),
    ("ViT-S/B", re.compile(r"vit|beit|eva02|deit", re.IGNORECASE)),
    ("ConvNeXt", re.compile(r"convnext", re.IGNORECASE)),
    ("ResNet", re.compile(r"resnet|\bRN\d", re.IGNORECASE)),
)
ALL_TAPS = "all_taps"  # rate_from of the all-tap run (the report's throughput rows)


def architecture(name: str) -> str | None:
    """The benchmarked architecture a model name belongs to, or None (the controls)."""
    return next((arch for arch, pattern in ARCHITECTURE_PATTERNS if pattern.search(name)), None)


def model_name(entry: dict[str, Any], config: dict[str, Any]) -> str:
    """The network a config's model entry builds: its id, for a zoo run its backbone's timm
    model."""
    if entry.get("source") == "zoo":
        zoo = config.get("zoo") or {}
        backbone = (zoo.get("objectives") or {}).get(entry["id"], {}).get("backbone")
        return str((zoo.get("backbones") or {}).get(backbone, {}).get("timm_model", entry["id"]))
    return str(entry["id"])


def config_architectures(config_path: str) -> dict[str, str | None]:
    """Each model of the config (a path under the repository) and its architecture."""
    from repdiag.api import load_config

    config = load_config(ROOT / config_path)
    entries = config.get("models") or {}
    return {key: architecture(model_name(entry, config)) for key, entry in entries.items()}


def measurements(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's measured rates, each with its architecture and number of taps: the paper
    pass per model and, where the report has it, the all-tap run of ``report["model"]``."""
    found = []
    for key, row in report.get("paper_pass", {}).items():
        rates = {p: row[p]["tflops"] for p in PRECISIONS if "tflops" in row.get(p, {})}
        arch = BENCHMARK_ARCHITECTURE.get(key) or architecture(row["model"])
        if rates:
            found.append({"from": key, "architecture": arch, "taps": len(row["layers"]),
                          "model": row["model"], "which": ", ".join(row["layers"]),
                          "tflops": rates})  # fmt: skip
    rates = {}
    for row in report.get("throughput", []):
        if row.get("method") == "auto" and "tflops" in row:
            rates.setdefault(row["precision"], row["tflops"])
    if rates:
        taps = len(report.get("flops", {}).get("auto", {}).get("methods", {})) or None
        found.append({"from": ALL_TAPS, "architecture": architecture(report["model"]),
                      "taps": taps, "model": report["model"], "which": f"all {taps} taps",
                      "tflops": rates})  # fmt: skip
    return found


def choose_rate(measured: list[dict], arch: str | None, taps: int | None, precision: str):
    """The measurement of ``arch`` at ``precision`` whose taps are closest to ``taps`` (None:
    every tap, so the most taps measured); None when ``arch`` has none."""
    own = [m for m in measured if m["architecture"] == arch and precision in m["tflops"]]
    if arch is None or not own:
        return None
    return min(own, key=lambda m: abs(m["taps"] - taps) if taps else -(m["taps"] or 0))


def _project(report: dict, config: str, images: int, models: list[tuple], skipped: dict):
    """The projection of ``models`` ((key, FLOPs, taps or None) each) at ``report``'s rates."""
    measured = measurements(report)
    archs = config_architectures(config)
    out, totals = {}, dict.fromkeys(PRECISIONS, 0.0)
    for key, flops, taps in models:
        arch = archs.get(key)
        hours, rates, source = {}, {}, {}
        for precision in PRECISIONS:
            chosen = choose_rate(measured, arch, taps, precision)
            if chosen is None:  # a control, or an architecture not measured: the slowest rate
                rated = [m for m in measured if precision in m["tflops"]]
                if not rated:
                    continue
                chosen = min(rated, key=lambda m: m["tflops"][precision])
                label = f"slowest measured ({chosen['from']}; no {arch or 'network'} measurement)"
            else:
                label = chosen["from"]
            rates[precision], source[precision] = chosen["tflops"][precision], label
            hours[precision] = flops / (rates[precision] * 1e12) / 3600
        runtime = slurm_runtime_minutes(key)
        out[key] = {
            "pflop": flops / 1e15,
            "architecture": arch,
            "taps": taps,
            "rate_from": source["fp32"],
            "tflops": rates,
            "hours": hours["fp32"],
            "hours_by_precision": hours,
            "slurm_runtime_min": runtime,
            "fits_runtime": hours["fp32"] * 60 <= runtime,
            "runtime_min_suggested": runtime_minutes(hours["fp32"]),
        }
        totals = {p: t + hours[p] for p, t in totals.items() if p in hours}
    return {
        "config": config,
        "images_per_model": images,
        "stage_pflop": sum(m["pflop"] for m in out.values()),
        "stage_hours": totals["fp32"],
        "stage_hours_by_precision": totals,
        "rates": {m.pop("from"): m for m in measured},
        "models": out,
        "skipped": skipped,
    }  # fmt: skip


def project(report: dict[str, Any], size: dict, plan) -> dict[str, Any]:
    """Projected hours of the config's Jacobian stage (``plan``: :func:`stage_plan`): each
    planned model at the rates measured on its own architecture, from the measurement whose
    taps are closest to the model's planned taps (:func:`choose_rate`)."""
    models = [
        (m.key, m.total_flops, sum(1 for t in m.taps if t.method != "setup")) for m in plan.models
    ]
    return _project(report, size["config"], plan.settings["images"], models, plan.skipped)


def reproject(report: dict[str, Any], replan: bool = False) -> dict[str, Any]:
    """The projection of a written report at its measured rates (all of them: the all-tap run
    included), for the FLOPs its projection stored (``replan``: the config planned again)."""
    if replan:
        size = PAPER_MODELS[report["mode"]]
        return project(report, size, stage_plan(size))
    stored = report["projection"]
    models = [(key, m["pflop"] * 1e15, m.get("taps")) for key, m in stored["models"].items()]
    return _project(
        report, stored["config"], stored["images_per_model"], models, stored.get("skipped", {})
    )


def projection_lines(projection: dict[str, Any]) -> list[str]:
    """The projection in words: the stage per precision, then each model."""
    hours = projection["stage_hours_by_precision"]
    lines = [
        f"{projection['config']} Jacobian stage ({projection['images_per_model']} images per "
        f"model): {projection['stage_pflop']:.0f} PFLOP, "
        + ", ".join(f"{p.upper()} {h:.2f} GPU-hours" for p, h in hours.items()),
        "rates (TFLOP/s): " + "; ".join(
            f"{name}: {r['architecture']}, {r['model']} ({r['which']}), "
            + " ".join(f"{p.upper()} {t:.1f}" for p, t in r["tflops"].items())
            for name, r in projection["rates"].items()
        ),
    ]  # fmt: skip
    for key, m in projection["models"].items():
        lines.append(
            f"  {key}: {m['architecture']}, {m['pflop']:.3g} PFLOP at {m['rate_from']}: "
            + ", ".join(f"{p.upper()} {h:.3f} h" for p, h in m["hours_by_precision"].items())
            + f"; SLURM {m['slurm_runtime_min']} min, suggested {m['runtime_min_suggested']}"
        )
    return lines


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
            report["projection"] = project(report, size, plan)  # refined after every model
        save()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="The projection of a benchmarks/gpu.sh report.")
    parser.add_argument("report", type=Path, help="a JSON written by benchmarks/gpu.sh --json")
    parser.add_argument("--replan", action="store_true", help="plan the config again here")
    parser.add_argument("--runtimes", type=Path, help="write the suggested SLURM runtimes here")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    projection = reproject(report, replan=args.replan)
    if args.runtimes:
        write_runtimes({**projection, "device_name": report.get("device_name")}, args.runtimes)
    print("\n".join(projection_lines(projection)))
    return projection


if __name__ == "__main__":
    main()
