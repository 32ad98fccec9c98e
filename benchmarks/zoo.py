"""Zoo training speed: steps/s per objective on this machine and the projected zoo wall time.

For every zoo run of a config (default: config.yaml) this builds the run exactly as train_zoo
does, times ``--steps`` optimiser steps after ``--warmup`` untimed ones with ``--threads`` torch
threads, and compares them with a baseline measured in the same process: one forward + backward
of the bare backbone on one view of the batch. The projection schedules the runs on ``--jobs``
parallel workers (longest first, as the budget assumes ``snakemake --cores 2`` with 1 thread
per job) and adds the measured setup time of each run.

With ``--flops`` it also profiles where a step's time goes, per run: the FLOPs of one training
step counted by ``torch.utils.flop_counter`` (convolutions and matmuls, forward and backward), the
images/s and GFLOP/s the step achieves, the same for the bare backbone's forward + backward in
NCHW and in channels_last (the layout ratio, measured side by side), and the share of the step
spent rendering the scenes. Augmentations are batched tensor ops (no per-sample Python loop).

Times are taken twice: wall clock, and the process's CPU time. With one thread the CPU time is
what the wall time would be on an idle core, so the projection uses it; on a shared machine the
wall clock is inflated by the other load (the load average is printed).

    .venv/bin/python benchmarks/zoo.py [--config config.yaml] [--steps 3] [--jobs 2] [--flops]
"""

from __future__ import annotations

import argparse
import heapq
import os
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from repdiag.core.config import load_config
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.spec import run_spec, zoo_runs
from repdiag.encoders.zoo.train import build_objective, make_optimizer, to_batch, train_step

REPO = Path(__file__).resolve().parent.parent


def baseline_step_s(objective, spec, repeats: int) -> float:
    """CPU seconds per forward + backward of the bare backbone on one un-augmented view."""
    batch = to_batch(
        scene_batch(objective.scenes, spec["scenes"]["seed"], 0, spec["batch_size"]), "cpu"
    )
    x = objective.normalize(batch.images)
    objective.backbone(x).square().mean().backward()  # warm-up
    start = time.process_time()
    for _ in range(repeats):
        objective.backbone(x).square().mean().backward()
    objective.zero_grad(set_to_none=True)
    return (time.process_time() - start) / repeats


def measure(spec: dict, steps: int, warmup: int) -> dict:
    t0 = time.process_time()
    objective, _ = build_objective(spec)
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    setup_s = time.process_time() - t0
    for step in range(warmup):
        train_step(objective, optimizer, spec, step, gen)
    start, start_cpu = time.perf_counter(), time.process_time()
    for step in range(warmup, warmup + steps):
        train_step(objective, optimizer, spec, step, gen)
    wall_s = (time.perf_counter() - start) / steps
    step_s = (time.process_time() - start_cpu) / steps
    base_s = baseline_step_s(objective, spec, max(1, steps // 2))
    return {
        "run": spec["run"],
        "objective": spec["objective"],
        "backbone": spec["backbone"],
        "batch": spec["batch_size"],
        "steps": spec["steps"],
        "wall_s": wall_s,
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "ratio": step_s / base_s,
        "setup_s": setup_s,
        "projected_s": setup_s + spec["steps"] * step_s,
    }


def counted_flops(fn) -> int:
    """FLOPs of ``fn()`` as torch's FlopCounterMode counts them (matmuls and convolutions)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def bare_pass_s(objective, x: torch.Tensor, repeats: int) -> float:
    """CPU seconds of one forward + backward of the bare backbone on ``x``."""
    objective.backbone(x).square().mean().backward()  # warm-up (and channels_last weights)
    start = time.process_time()
    for _ in range(repeats):
        objective.backbone(x).square().mean().backward()
    objective.zero_grad(set_to_none=True)
    return (time.process_time() - start) / repeats


def flop_profile(spec: dict, steps: int) -> dict:
    """Images/s and GFLOP/s of a training step, of the bare backbone in NCHW and channels_last,
    and the share of the step spent rendering scenes (CPU times, one process)."""
    objective, _ = build_objective(spec)
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    train_step(objective, optimizer, spec, 0, gen)
    step_flops = counted_flops(lambda: train_step(objective, optimizer, spec, 1, gen))
    start = time.process_time()
    for step in range(2, 2 + steps):
        train_step(objective, optimizer, spec, step, gen)
    step_s = (time.process_time() - start) / steps
    start = time.process_time()
    for step in range(steps):
        scene_batch(objective.scenes, spec["scenes"]["seed"], step, spec["batch_size"])
    render_s = (time.process_time() - start) / steps
    batch = to_batch(
        scene_batch(objective.scenes, spec["scenes"]["seed"], 0, spec["batch_size"]), "cpu"
    )
    x = objective.normalize(batch.images)
    bare_flops = counted_flops(lambda: objective.backbone(x).square().mean().backward())
    nchw_s = bare_pass_s(objective, x, steps)
    objective.backbone.to(memory_format=torch.channels_last)
    nhwc_s = bare_pass_s(objective, x.contiguous(memory_format=torch.channels_last), steps)
    objective.backbone.to(memory_format=torch.contiguous_format)
    images = spec["batch_size"]
    return {
        "run": spec["run"],
        "images_per_s": images / step_s,
        "step_gflop": step_flops / 1e9,
        "step_gflops": step_flops / step_s / 1e9,
        "bare_gflops_nchw": bare_flops / nchw_s / 1e9,
        "bare_gflops_nhwc": bare_flops / nhwc_s / 1e9,
        "nhwc_speedup": nchw_s / nhwc_s,
        "render_share": render_s / step_s,
    }


def print_flop_profiles(config: dict, runs: list[str], steps: int) -> None:
    print(f"\n{'run':<22}{'images/s':>9}{'GFLOP/step':>11}{'step GFLOP/s':>13}{'bare NCHW':>10}"
          f"{'bare NHWC':>10}{'NHWC/NCHW':>10}{'render':>8}")  # fmt: skip
    for run in runs:
        row = flop_profile(run_spec(config, run), steps)
        print(f"{row['run']:<22}{row['images_per_s']:>9.0f}{row['step_gflop']:>11.2f}{row['step_gflops']:>13.1f}"
              f"{row['bare_gflops_nchw']:>10.1f}{row['bare_gflops_nhwc']:>10.1f}{row['nhwc_speedup']:>9.2f}x"
              f"{row['render_share']:>7.0%}", flush=True)  # fmt: skip
    print("GFLOP/s are counted FLOPs (torch.utils.flop_counter) over CPU seconds; 'bare' is one forward + "
          "backward of the backbone alone on the batch; NHWC/NCHW > 1 means channels_last is faster; "
          "'render' is the scene rendering's share of a step")  # fmt: skip


def schedule(durations: list[float], jobs: int) -> float:
    """Makespan of longest-first list scheduling on ``jobs`` identical workers."""
    workers = [0.0] * jobs
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(workers, workers[0] + d)
    return max(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (as train_zoo)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel training jobs")
    parser.add_argument("--runs", nargs="*", help="only these runs")
    parser.add_argument("--flops", action="store_true", help="also profile FLOPs and layouts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    runs = args.runs or zoo_runs(config)
    rows = []
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.threads} torch thread(s)"
    )
    print(f"{'run':<18}{'objective':<14}{'backbone':<10}{'batch':>6}{'steps':>7}{'wall s/step':>12}"
          f"{'cpu s/step':>11}{'steps/s':>9}{'vs bare':>9}{'setup s':>9}{'projected s':>13}")  # fmt: skip
    for run in runs:
        row = measure(run_spec(config, run), args.steps, args.warmup)
        rows.append(row)
        print(f"{row['run']:<18}{row['objective']:<14}{row['backbone']:<10}{row['batch']:>6}{row['steps']:>7}"
              f"{row['wall_s']:>12.3f}{row['step_s']:>11.3f}{row['steps_per_s']:>9.2f}{row['ratio']:>8.1f}x{row['setup_s']:>9.1f}"
              f"{row['projected_s']:>13.0f}", flush=True)  # fmt: skip
    serial = sum(r["projected_s"] for r in rows)
    wall = schedule([r["projected_s"] for r in rows], args.jobs)
    print(f"\nprojected zoo: {serial / 60:.1f} min of training in total; "
          f"{wall / 60:.1f} min wall time on {args.jobs} parallel jobs x {args.threads} thread(s) "
          f"(the zoo's share of the 45-minute budget of the whole make run)")  # fmt: skip
    if args.flops:
        print_flop_profiles(config, runs, args.steps)
    print("steps/s, 'vs bare' and projections use CPU time (= wall time on an idle core); 'vs bare' is "
          "the step time over one forward + backward of the bare backbone on one view")  # fmt: skip


if __name__ == "__main__":
    main()
