"""The tables of docs/performance.md's GPU section, rendered from a ``benchmarks/gpu.sh`` JSON.

    .venv/bin/python benchmarks/gpu_report.py benchmarks/measured/gpu-h200.json [--write docs/performance.md]

``--write`` replaces the block between the page's ``<!-- gpu:start -->`` and ``<!-- gpu:end -->``
markers, so the page's GPU numbers are always those of the committed run
(tests/benchmarks/test_gpu.py checks that they are). The projection is the one
benchmarks/gpu_paper.py makes from the report's rates (:func:`gpu_paper.reproject`): each model
at its own architecture's rates, the all-tap run's where the report has it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_paper, beside this file

START, END = "<!-- gpu:start -->", "<!-- gpu:end -->"
PRECISIONS = ("fp32", "tf32", "bf16")


def _pass_rows(report: dict[str, Any]) -> list[str]:
    rows = [
        "| model (taps) | TFLOP/image | " + " | ".join(
            f"{p.upper()} s, TFLOP/s (% of peak, % of matmul), JER error vs FP32" for p in PRECISIONS
        ) + " |",
        "|---|---|" + "---|" * len(PRECISIONS),
    ]  # fmt: skip
    for row in report["paper_pass"].values():
        cells = []
        for p in PRECISIONS:
            c = row[p]
            cells.append(
                f"{c['s']:.2f} s, {c['tflops']:.1f} ({100 * c['fraction_of_peak']:.0f}%, "
                f"{100 * c['fraction_of_matmul']:.0f}%), {c['max_rel_jer_error_vs_fp32']:.1e}"
            )
        taps = ", ".join(row["layers"])
        rows.append(
            f"| `{row['model']}` ({taps}) | {row['tflop_per_image']:.1f} | {' | '.join(cells)} |"
        )
    return rows


def _throughput_rows(report: dict[str, Any]) -> list[str]:
    rows = [
        "| method, precision | JVP batch | images/s | peak GiB | % of matmul |",
        "|---|---|---|---|---|",
    ]
    for r in report["throughput"]:
        if "same_as" in r:
            continue  # the same work as a row already listed
        rows.append(
            f"| {r['method']}, {r['precision']} | {r['batch_size']} | {r['images_per_s']:.3f} | "
            f"{r['peak_mib'] / 1024:.1f} | {100 * r['fraction_of_matmul']:.0f}% |"
        )
    return rows


def _facts(report: dict[str, Any]) -> list[str]:
    mm = report["matmul"]
    acc = report["accuracy"]
    repeat = next(
        (r["repeatability"] for r in report["paper_pass"].values() if "repeatability" in r), None
    )
    other = report["other_encoder"]
    proj = _projection(report)
    fits = sum(m["fits_runtime"] for m in proj["models"].values())
    hours = proj["stage_hours_by_precision"]
    lines = [
        f"- Device: {report['device_name']}, torch {report['torch']}; the whole run took "
        f"{report['elapsed_s']:.0f} s; skipped: {', '.join(report['skipped']) or 'nothing'}; "
        f"ops without a vmap batching rule: {', '.join(report['vmap_fallbacks']) or 'none'}.",
        "- Matmul rate measured in the run (n = 8192): "
        + ", ".join(f"{p.upper()} {mm[p]['tflops']:.1f} TFLOP/s" for p in PRECISIONS)
        + f" (datasheet dense peak {', '.join(str(report['peak_tflops'][p]) for p in PRECISIONS)}).",
        f"- JER against CPU float64 ({acc['images']} image, k = {acc['k']}, "
        f"taps {', '.join(acc['layers'])}), max relative error: "
        + ", ".join(f"{p.upper()} {acc[p]['max_rel_jer_error']:.1e}" for p in PRECISIONS)
        + ".",
        f"- Bit-for-bit repeatability (every tap of `{report['model']}`): "
        + ", ".join(
            f"{p.upper()} {'yes' if ok else 'NO'}" for p, ok in report["repeatable"].items()
        )
        + ".",
    ]
    if repeat:
        lines.append(
            f"- Deterministic mode on the paper pass of ViT-B/16: {repeat['deterministic_s']:.2f} s "
            f"against {repeat['nondeterministic_s']:.2f} s without it "
            f"({100 * repeat['deterministic_cost']:+.1f}%); two runs equal bit for bit: "
            f"{'yes' if repeat['bitwise_equal'] else 'NO'}."
        )
    lines += [
        f"- open_clip `{other['model']}` ({other['layers']} taps, no shortcut taps): "
        f"{other['images_per_s']:.3f} images/s, peak {other['peak_mib'] / 1024:.1f} GiB.",
        f"- Projection of `{proj['config']}`'s Jacobian stage ({proj['images_per_model']} images "
        f"per model; `benchmarks/gpu_paper.py`, each model at the rates measured on its own "
        f"architecture): {proj['stage_pflop']:.0f} PFLOP, **{hours['fp32']:.2f} GPU-hours** at "
        f"FP32{''.join(f', {hours[p]:.2f} at {p.upper()}' for p in PRECISIONS[1:] if p in hours)}"
        "; rates from "
        f"{_rate_sources(proj)}; {fits} of {len(proj['models'])} models fit their SLURM runtime "
        "at FP32. Suggested runtimes (x1.5 at FP32, at least 30 min) are in "
        "`profiles/slurm/jacobian_runtimes.yaml`.",
    ]
    return lines


def _projection(report: dict[str, Any]) -> dict[str, Any]:
    from gpu_paper import reproject

    return reproject(report)


def _rate_sources(proj: dict[str, Any]) -> str:
    """Which measurement each architecture's models took their FP32 rate from, in words."""
    groups: dict[tuple, int] = {}
    for m in proj["models"].values():
        key = (m["architecture"], m["rate_from"])
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (arch, source), n in groups.items():
        if arch is None:
            parts.append(f"{n} controls (no network): the slowest rate measured")
        else:
            rate = proj["rates"][source]
            parts.append(
                f"{arch} ({n}): `{rate['model']}` ({rate['which']}) at "
                f"{rate['tflops']['fp32']:.1f} TFLOP/s"
            )
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    """The GPU section's block: facts, the paper pass per model and precision, throughput."""
    parts = [
        *_facts(report),
        "",
        "The paper's pass (8 images, k = 32, q = 5, `auto`):",
        "",
        *_pass_rows(report),
        "",
        f"`{report['model']}` over every tap, {report['image_size']} px, k = {report['k']}, "
        f"q = {report['power_iters']}:",
        "",
        *_throughput_rows(report),
    ]
    return "\n".join(parts)


def write_block(page: Path, block: str) -> None:
    """Replace the text between the page's markers with ``block``."""
    text = page.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{START}\n{block}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a JSON written by benchmarks/gpu.sh --json")
    parser.add_argument("--write", type=Path, help="the page whose gpu block to replace")
    args = parser.parse_args()
    block = render(json.loads(args.report.read_text()))
    if args.write:
        write_block(args.write, block)
    else:
        print(block)


if __name__ == "__main__":
    main()
