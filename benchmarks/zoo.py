"""Zoo training speed: the old step against the new one, per objective, side by side in one process.

For one run of each objective of a config (default: config/config.yaml; the first run that trains it,
plus an ``mae`` run on the config's ViT when no run trains mae) this builds the run twice, as the
old step had it (benchmarks/zoo_baseline.py: the step of commit 482f62e, kept verbatim) and as
train_zoo trains it now (repdiag.encoders.zoo.train: batched views, channels_last, fused AdamW,
batches rendered ahead in a worker thread, losses read every 25 steps), and times them in
alternating rounds of ``--steps`` steps, ``--rounds`` times, after ``--warmup`` untimed steps; the
best round of each counts (the machine is shared: the load average is printed before and after).

Per objective it prints steps/s and scenes/s of both, the speed-up, the GFLOP/s of the step (the
convolutions' and matmuls' FLOPs of one training step, forward and backward, counted by
``torch.utils.flop_counter``, over the step's time), that as a fraction of the float32 matmul rate
measured in the same process (a 1024 x 1024 x 1024 ``torch.mm``), and the step against the bare
backbone: the step's time over the time the bare backbone's forward + backward takes for the same
FLOPs (1.0 = the step runs at the backbone's own rate; heads, views, losses and the optimiser
are the excess). Below, the bare backbone of each architecture in NCHW and channels_last.

Times are CPU seconds of the main thread, the step's critical path: with a spare core the
worker's rendering runs beside it. The process's CPU time (the worker included: what a step costs
when every core is busy) and the wall time are printed too. train() keeps freed heap memory for
its process (repdiag.encoders.zoo.allocator): the benchmark measures that first, on the bare
backbone, then keeps it for the old step and the new alike (so the table's speed-ups leave it out;
the old train_zoo job ran with glibc's default).

    .venv/bin/python benchmarks/zoo.py [--config config/config.yaml] [--steps 3] [--rounds 3] [--threads 1]
    .venv/bin/python benchmarks/zoo.py --config config/zoo_long.yaml --project  # the whole zoo's time
    .venv/bin/python benchmarks/zoo.py --backbone vit --objectives barlow_twins vicreg mae dino simclr clip supervised
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from zoo_baseline import baseline, old_train_step  # noqa: E402

from repdiag.api import load_config  # noqa: E402
from repdiag.encoders.zoo.allocator import keep_freed_memory  # noqa: E402
from repdiag.encoders.zoo.scenes import SceneSettings, scene_batch  # noqa: E402
from repdiag.encoders.zoo.spec import FAMILIES, run_spec, zoo_runs  # noqa: E402
from repdiag.encoders.zoo.stream import Prefetcher  # noqa: E402
from repdiag.encoders.zoo.train import (  # noqa: E402
    LossLog,
    build_objective,
    make_optimizer,
    to_batch,
    train_step,
)


def load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def matmul_gflops(repeats: int = 5, n: int = 1024) -> float:
    """Float32 GFLOP/s of ``torch.mm`` on n x n matrices, best of ``repeats`` (main-thread CPU)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - start)
    return 2 * n**3 / best / 1e9


class OldStep:
    """The old step (benchmarks/zoo_baseline.py) on consecutive batches."""

    def __init__(self, spec: dict) -> None:
        self.spec, self.step = spec, 0
        self.objective, self.optimizer = baseline(spec)
        self.gen = torch.Generator().manual_seed(spec["seed"])

    def __call__(self) -> None:
        old_train_step(self.objective, self.optimizer, self.spec, self.step, self.gen)
        self.step += 1

    def close(self) -> None:
        pass


class NewStep:
    """The current step as train() runs it: prefetched batches, losses read in blocks."""

    def __init__(self, spec: dict) -> None:
        self.spec, self.step = spec, 0
        self.objective, _ = build_objective(spec, "cpu")
        self.objective.train()
        self.optimizer = make_optimizer(self.objective, spec)
        self.gen = torch.Generator().manual_seed(spec["seed"])
        self.record = LossLog(spec)
        self.stream = Prefetcher(
            self.objective.scenes, spec["scenes"]["seed"], spec["batch_size"], spec["steps"], "cpu"
        )

    def __call__(self) -> None:
        batch = self.stream.get(self.step)
        self.record.add(
            train_step(self.objective, self.optimizer, self.spec, self.step, self.gen, None, batch)
        )
        self.step += 1

    def close(self) -> None:
        self.record.read()
        self.stream.close()


def timed(step, n: int) -> tuple[float, float, float]:
    """(main-thread CPU, process CPU, wall) seconds per step over ``n`` steps."""
    thread, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(n):
        step()
    return tuple(
        (now - then) / n
        for now, then in zip(
            (time.thread_time(), time.process_time(), time.perf_counter()),
            (thread, process, wall),
            strict=True,
        )
    )


def side_by_side(spec: dict, steps: int, rounds: int, warmup: int) -> dict[str, tuple]:
    """The best (by main-thread CPU) round of the old and of the new step, alternating."""
    steppers = {"old": OldStep(spec), "new": NewStep(spec)}
    best: dict[str, tuple] = {}
    try:
        for stepper in steppers.values():
            for _ in range(warmup):
                stepper()
        for _ in range(rounds):
            for name, stepper in steppers.items():
                times = timed(stepper, steps)
                if name not in best or times[0] < best[name][0]:
                    best[name] = times
    finally:
        for stepper in steppers.values():
            stepper.close()
    return best


def step_flops(spec: dict) -> int:
    """FLOPs of one current training step (convolutions and matmuls, forward and backward)."""
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    train_step(objective, optimizer, spec, 0, gen)
    with FlopCounterMode(display=False) as counter:
        train_step(objective, optimizer, spec, 1, gen)
    return counter.get_total_flops()


def bare_pass(spec: dict, layout: torch.memory_format, repeats: int) -> tuple[float, int]:
    """(best main-thread CPU seconds, FLOPs) of the bare backbone's forward + backward on one
    batch of 64 px scenes in ``layout``."""
    objective, _ = build_objective(spec, "cpu")
    objective.use_memory_format(layout)
    objective.train()
    batch = to_batch(scene_batch(objective.scenes, 1, 0, spec["batch_size"]), "cpu")
    x = objective.normalize(batch.images)

    def once() -> None:
        objective.backbone(x).square().mean().backward()

    once()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        once()
        best = min(best, time.thread_time() - start)
    with FlopCounterMode(display=False) as counter:
        once()
    return best, counter.get_total_flops()


def allocator_effect(spec: dict, repeats: int) -> None:
    """The bare backbone's forward + backward on two views' worth of scenes (channels_last),
    with glibc's default allocator and then with freed memory kept (keep_freed_memory, which
    train() sets for its process and this benchmark then keeps for everything after): best
    main-thread CPU time and minor page faults per pass, one after the other (mallopt cannot
    be undone)."""
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    scenes = scene_batch(objective.scenes, 1, 0, 2 * spec["batch_size"])
    x = objective.normalize(to_batch(scenes, "cpu").images)

    def measure() -> tuple[float, float]:
        objective.backbone(x).square().mean().backward()
        best, faults = float("inf"), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(repeats):
            start = time.thread_time()
            objective.backbone(x).square().mean().backward()
            best = min(best, time.thread_time() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return best, faults / repeats

    default = measure()
    kept = keep_freed_memory() and measure()
    print(f"allocator, bare {spec['backbone']} on {len(x)} scenes: glibc default "
          f"{default[0] * 1e3:.1f} ms ({default[1]:.0f} page faults/pass)", end="")  # fmt: skip
    if kept:
        print(f"; freed memory kept {kept[0] * 1e3:.1f} ms ({kept[1]:.0f} faults/pass): "
              f"{default[0] / kept[0]:.2f}x")  # fmt: skip
    else:
        print("; not glibc, nothing to keep")


def objective_specs(config: dict) -> dict[str, dict]:
    """One run spec per objective: ``<objective>_s0`` of the config, else its first run without
    the JER regulariser or arrangement groups; mae on the config's ViT when no run trains it."""
    specs: dict[str, dict] = {}
    for run in zoo_runs(config):
        spec = run_spec(config, run)
        plain = not (spec.get("jer_regulariser") or {}).get("weight")
        plain = plain and spec.get("arrangement_groups", 1) == 1 and spec["steps"] > 0
        if plain and (spec["objective"] not in specs or run == f"{spec['objective']}_s0"):
            specs[spec["objective"]] = spec
    if "mae" not in specs and "vit" in config["zoo"]["backbones"] and specs:
        config = copy.deepcopy(config)
        runs = config["zoo"]["objectives"]
        template = next(iter(specs.values()))["run"]
        runs["mae_vit"] = {**copy.deepcopy(runs[template]), "objective": "mae", "backbone": "vit"}
        runs["mae_vit"]["hparams"] = {}
        specs["mae"] = run_spec(config, "mae_vit")
    return {name: specs[name] for name in FAMILIES if name in specs}


def bare_rates(specs: dict[str, dict], repeats: int) -> dict[str, tuple[float, float]]:
    """The bare backbone of each architecture: (NCHW, channels_last) GFLOP/s."""
    rates: dict[str, tuple[float, float]] = {}
    for spec in specs.values():
        if spec["backbone"] not in rates:
            nchw_s, flops = bare_pass(spec, torch.contiguous_format, repeats)
            nhwc_s, _ = bare_pass(spec, torch.channels_last, repeats)
            rates[spec["backbone"]] = (flops / nchw_s / 1e9, flops / nhwc_s / 1e9)
    return rates


def print_bare(rates: dict[str, tuple[float, float]], specs: dict, matmul: float) -> None:
    print(f"\n{'backbone':<10}{'batch':>6}{'NCHW GFLOP/s':>14}{'NHWC GFLOP/s':>14}{'NHWC/NCHW':>11}"
          f"{'NHWC of matmul':>16}")  # fmt: skip
    batch = next(iter(specs.values()))["batch_size"]
    for backbone, (nchw, nhwc) in rates.items():
        print(f"{backbone:<10}{batch:>6}{nchw:>14.1f}{nhwc:>14.1f}{nhwc / nchw:>10.2f}x"
              f"{nhwc / matmul:>16.0%}")  # fmt: skip


def print_steps(rows: dict, specs: dict, rates: dict, matmul: float) -> None:
    print(f"\n{'objective':<13}{'batch':>6}{'steps/s old':>12}{'new':>7}{'speed-up':>9}"
          f"{'scenes/s old':>13}{'new':>6}{'GFLOP/s old':>12}{'new':>6}{'of matmul old':>14}"
          f"{'new':>5}{'vs bare old':>12}{'new':>6}{'process x':>10}{'wall x':>8}")  # fmt: skip
    for name, (old, new, gflop) in rows.items():
        spec = specs[name]
        rate = max(rates[spec["backbone"]])
        print(f"{name:<13}{spec['batch_size']:>6}{1 / old[0]:>12.2f}{1 / new[0]:>7.2f}"
              f"{old[0] / new[0]:>8.2f}x{spec['batch_size'] / old[0]:>13.0f}"
              f"{spec['batch_size'] / new[0]:>6.0f}{gflop / old[0]:>12.1f}{gflop / new[0]:>6.1f}"
              f"{gflop / old[0] / matmul:>14.0%}{gflop / new[0] / matmul:>5.0%}"
              f"{old[0] * rate / gflop:>11.2f}x{new[0] * rate / gflop:>5.2f}x"
              f"{old[1] / new[1]:>9.2f}x{old[2] / new[2]:>7.2f}x")  # fmt: skip
    print("steps/s, scenes/s and GFLOP/s use the main thread's CPU time (the step's critical path; "
          "the new step's rendering runs in a worker thread); 'process x' is the speed-up in the "
          "process's CPU time (worker included), 'wall x' in wall time; 'vs bare' is the step's "
          "time over the bare backbone's forward + backward for the same FLOPs (its best layout)")  # fmt: skip


def render_seconds(spec: dict, batches: int) -> float:
    """Main-thread CPU seconds to render one of ``spec``'s training batches (its scenes, image
    size and batch size), the best of ``batches`` consecutive batches of its stream."""
    scenes = SceneSettings.from_config(
        spec["scenes"], spec["image_size"], arrangement_groups=spec["arrangement_groups"]
    )
    times = []
    for step in range(batches):
        start = time.thread_time()
        scene_batch(scenes, spec["seed"], step, spec["batch_size"])
        times.append(time.thread_time() - start)
    return min(times)


def print_projection(config: dict, rows: dict, specs: dict, batches: int) -> None:
    """The config's whole zoo projected from the measured new step, per objective: its runs'
    steps x the step's main-thread CPU seconds, and rendering's share of a step done serially
    (one core); with a spare core the worker renders beside the step, off its critical path
    while rendering takes less than the step."""
    print(f"\n{'objective':<13}{'runs':>5}{'steps':>8}{'batch':>6}{'step s':>8}{'render s':>9}"
          f"{'render share':>13}{'CPU h, serial':>14}{'CPU h, render beside':>21}")  # fmt: skip
    total = [0.0, 0.0]
    trained = [run_spec(config, run) for run in zoo_runs(config)]
    for name, (_, new, _) in rows.items():
        runs = [r for r in trained if r["objective"] == name and r["steps"] > 0]
        steps = sum(r["steps"] for r in runs)
        render = render_seconds(specs[name], batches)
        serial, beside = steps * (new[0] + render) / 3600, steps * max(new[0], render) / 3600
        total = [total[0] + serial, total[1] + beside]
        print(f"{name:<13}{len(runs):>5}{steps // max(len(runs), 1):>8}"
              f"{specs[name]['batch_size']:>6}{new[0]:>8.3f}{render:>9.3f}"
              f"{render / (render + new[0]):>13.0%}{serial:>14.2f}{beside:>21.2f}")  # fmt: skip
    print(f"{'all':<13}{'':>49}{total[0]:>14.2f}{total[1]:>21.2f}")
    print(
        "step s: the new step's main-thread CPU seconds at the run's batch (1 torch thread); "
        "render s: one batch of its scenes; on a GPU the step shrinks and rendering, in the "
        "worker, bounds a step from below: a run is GPU-bound while render s < its GPU step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config/config.yaml"))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (best counts)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (as train_zoo)")
    parser.add_argument("--objectives", nargs="*", help="only these objectives")
    parser.add_argument(
        "--project", action="store_true", help="project the config's zoo from the measured rates"
    )
    parser.add_argument(
        "--backbone", help="train every run on this zoo.backbones entry (e.g. vit) instead"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    if args.backbone:  # the same runs on another backbone (issue 58: the ViT at the ResNet's bar)
        for run in config["zoo"]["objectives"].values():
            run["backbone"] = args.backbone
    specs = objective_specs(config)
    specs = {k: v for k, v in specs.items() if not args.objectives or k in args.objectives}
    print(f"{load()} on {os.cpu_count()} cores; {args.threads} torch thread(s)", flush=True)
    allocator_effect(next(iter(specs.values())), args.rounds * args.steps)
    matmul = [matmul_gflops()]
    rates = bare_rates(specs, args.rounds * args.steps)
    rows = {}
    for name, spec in specs.items():
        best = side_by_side(spec, args.steps, args.rounds, args.warmup)
        rows[name] = (best["old"], best["new"], step_flops(spec) / 1e9)
        matmul.append(matmul_gflops())
        print(f"{name}: {rows[name][0][0] / rows[name][1][0]:.2f}x", flush=True)
    print(f"float32 matmul (1024^3 torch.mm, the best of {len(matmul)} measurements spread over "
          f"the run): {max(matmul):.1f} GFLOP/s")  # fmt: skip
    print_bare(rates, specs, max(matmul))
    print_steps(rows, specs, rates, max(matmul))
    if args.project:
        print_projection(config, rows, specs, args.rounds * args.steps)
    print(f"\n{load()} (after)")


if __name__ == "__main__":
    main()
