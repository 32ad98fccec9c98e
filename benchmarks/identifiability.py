"""Identifiability training speed: steps/s per kind of grid cell and the projected grid time.

For each kind of cell in a config's identifiability grid (generator x sampling x encoder x loss
x ratio; seed 0 stands for all seeds) this builds the cell exactly as ``run_cell`` does, times
``--steps`` training steps (sampling, generator, encoder, loss, Adam) after ``--warmup``
untimed ones, and compares them with a baseline measured in the same process: one forward and
backward pass of the same encoder on the same number of points with a trivial loss, i.e. the
step without sampling and without the contrastive loss. The projection multiplies by every
cell's steps, adds the measured evaluation time and ``--job-overhead`` seconds per job (Python
start, torch import, Snakemake script set-up; measure it from logs/benchmarks/identifiability_cell)
and schedules the cells longest first on ``--jobs`` workers.

Times are CPU times of this process with one torch thread: what the wall time would be on an idle
core. On a shared machine the wall clock is inflated by the other load (printed).

    .venv/bin/python benchmarks/identifiability.py [--config config.yaml] [--steps 40] [--jobs 2]
"""

from __future__ import annotations

import argparse
import heapq
import os
import time
from pathlib import Path

import numpy as np
import torch

from repdiag.config import load_config
from repdiag.contrastive.study import build_cell, cell_params, grid_cells
from repdiag.contrastive.train import contrastive_step_loss, encode_latents
from repdiag.data.sphere import sample_uniform
from repdiag.metrics.identifiability import identifiability_metrics

REPO = Path(__file__).resolve().parent.parent


def points_per_step(settings) -> int:
    """Latents encoded per step: anchors, positives, negatives (constrained ones per group)."""
    if settings.loss != "support_corrected":
        return 2 * settings.batch_size + settings.n_negatives
    constrained = round(settings.ratio * settings.n_negatives)
    groups = settings.batch_size // settings.group_size
    return 2 * settings.batch_size + settings.n_negatives - constrained + groups * constrained


def measure(params: dict, steps: int, warmup: int) -> dict:
    settings, generator, encoder = build_cell(params)
    optimiser = torch.optim.Adam(encoder.parameters(), lr=settings.lr)
    rng = np.random.default_rng(0)

    def step() -> None:
        loss = contrastive_step_loss(encoder, generator, settings, rng, "cpu")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    for _ in range(warmup):
        step()
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    wall_s = (time.perf_counter() - start) / steps
    step_s = (time.process_time() - start_cpu) / steps
    # baseline: the encoder's forward + backward on the same number of points, trivial loss
    n_points = points_per_step(settings)
    x = generator(
        torch.tensor(sample_uniform(n_points, generator.latent_dim, rng), dtype=torch.float32)
    )
    start_cpu = time.process_time()
    for _ in range(steps):
        encoder(x).sum().backward()
    base_s = (time.process_time() - start_cpu) / steps
    evaluation = params["evaluation"]
    start_cpu = time.process_time()
    z = sample_uniform(evaluation["n_samples"], generator.latent_dim, np.random.default_rng(1))
    identifiability_metrics(encode_latents(encoder, generator, z), z, evaluation["train_fraction"])
    eval_s = time.process_time() - start_cpu
    return {
        "kind": params["cell"].rsplit("-s", 1)[0],
        "points": n_points,
        "wall_s": wall_s,
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "ratio": step_s / base_s,
        "eval_s": eval_s,
        "cell_s": settings.steps * step_s + eval_s,
    }


def schedule(durations: list[float], jobs: int) -> float:
    """Makespan of longest-first list scheduling on ``jobs`` identical workers."""
    workers = [0.0] * jobs
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(workers, workers[0] + duration)
    return max(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config.yaml"))
    parser.add_argument("--steps", type=int, default=40, help="timed steps per kind of cell")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per kind of cell")
    parser.add_argument("--jobs", type=int, default=2, help="parallel cell jobs")
    parser.add_argument(
        "--job-overhead", type=float, default=4.0, help="CPU s per job outside training"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    section = load_config(args.config)["identifiability"]
    cells = grid_cells(section)
    kinds: dict[str, list] = {}
    for cell in cells:
        kinds.setdefault(cell.name.rsplit("-s", 1)[0], []).append(cell)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; 1 torch thread")
    print(f"{'kind of cell':<52}{'cells':>6}{'points':>8}{'wall s/step':>12}{'cpu s/step':>11}"
          f"{'steps/s':>9}{'vs bare':>9}{'eval s':>8}{'cell s':>8}")  # fmt: skip
    durations = []
    for kind, members in kinds.items():
        row = measure(cell_params(section, members[0].name), args.steps, args.warmup)
        durations += [row["cell_s"] + args.job_overhead] * len(members)
        print(f"{kind:<52}{len(members):>6}{row['points']:>8}{row['wall_s']:>12.4f}{row['step_s']:>11.4f}"
              f"{row['steps_per_s']:>9.1f}{row['ratio']:>8.1f}x{row['eval_s']:>8.2f}{row['cell_s']:>8.1f}",
              flush=True)  # fmt: skip
    wall = schedule(durations, args.jobs)
    print(f"\nprojected grid: {len(cells)} cells, {sum(durations) / 60:.1f} CPU min in total "
          f"(with {args.job_overhead:.0f} s per job outside training); {wall / 60:.1f} min wall time "
          f"on {args.jobs} parallel jobs x 1 thread (budget: 15 min)")  # fmt: skip
    print("steps/s and projections use CPU time (= wall time on an idle core); 'vs bare' is the "
          "step time over one forward + backward of the encoder on the same points")  # fmt: skip


if __name__ == "__main__":
    main()
