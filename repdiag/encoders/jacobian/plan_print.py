"""The planner's printout (:func:`format_plan`) and its command, ``repdiag plan <config>``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import torch

from repdiag.core.errors import RepdiagError
from repdiag.encoders.jacobian.plan_project import Plan, plan_config


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


def positive_rate(text: str) -> float:
    """``--rate``: a positive, finite FLOP/s (argparse refuses anything else, naming the flag)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive finite FLOP rate; give FLOP/s, e.g. 67e12"
        )
    return value


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
        type=positive_rate,
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
