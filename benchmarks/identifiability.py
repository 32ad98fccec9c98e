"""Identifiability training speed: the project's loop against a plain PyTorch loop, steps/s per
kind of grid cell and the projected grid time.

Loop comparison (first table, ``--batches``, default 256 and 2000): for the config's MLP cell
on the identity generator (restricted support, InfoNCE) and n anchors = n negatives = batch, in
one process on one thread, the steps/s of

* ``project``: the project's step (``contrastive_step_loss``: numpy sampling with exact vMF /
  restricted positives, generator, encoder per view, matmul InfoNCE) plus Adam;
* ``project, broadcast loss``: the same with the earlier elementwise loss
  (``info_nce_broadcast``, an (n, M, d) product) swapped in;
* ``plain``: a plain PyTorch loop with the same encoder, batch, negatives and loss value
  (anchors and negatives torch-normal, normalised; positives normalise(z + 0.3 noise), i.e.
  no exact vMF; logits by one matmul and ``F.cross_entropy``) plus Adam;

and the ratios project / plain and project / broadcast.

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

    .venv/bin/python benchmarks/identifiability.py [--config config/config.yaml] [--steps 40] [--jobs 2]

``--overlay FILE`` layers a config over ``--config`` as ``snakemake --configfile A B`` does (e.g.
config/identifiability_paper.yaml); ``--check`` projects the like-for-like check's cells
(``identifiability.check``) instead of the grid.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import heapq
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import yaml

import repdiag.identifiability.train as train_module
from repdiag.api import load_config
from repdiag.identifiability.losses import info_nce_broadcast
from repdiag.identifiability.metrics import HeldOutSettings, identifiability_metrics
from repdiag.identifiability.sphere import sample_uniform
from repdiag.identifiability.study import build_cell, cell_params, check_section, grid_cells
from repdiag.identifiability.train import contrastive_step_loss, encode_latents, encode_views

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
    evaluation = HeldOutSettings.from_config(params["evaluation"])
    start_cpu = time.process_time()
    z = sample_uniform(evaluation.n_samples, generator.latent_dim, np.random.default_rng(1))
    identifiability_metrics(
        encode_latents(encoder, generator, z), z, evaluation.train_fraction, evaluation.seed
    )
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


@contextlib.contextmanager
def broadcast_loss() -> Iterator[None]:
    """The training step with the earlier elementwise InfoNCE instead of the matmul form."""
    saved = train_module.info_nce
    train_module.info_nce = info_nce_broadcast
    try:
        yield
    finally:
        train_module.info_nce = saved


def _steps_per_s(step: Callable[[], None], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    start = time.process_time()
    for _ in range(steps):
        step()
    return steps / (time.process_time() - start)


def compare_loops(section: dict, batch: int, steps: int, warmup: int) -> dict[str, float]:
    """Steps/s (CPU time) of the project's loop, the same with the broadcast loss, and a plain loop."""
    section = copy.deepcopy(section)
    section["train"] = {**section["train"], "batch_size": batch}
    section["loss"] = {**section["loss"], "n_negatives": batch}
    params = cell_params(section, "identity-restricted-mlp-infonce-s0")
    settings, generator, encoder = build_cell(params)
    encoder.train()
    optimiser = torch.optim.Adam(encoder.parameters(), lr=settings.lr)
    rng = np.random.default_rng(0)

    def project_step() -> None:
        loss = contrastive_step_loss(encoder, generator, settings, rng, "cpu")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    def plain_step() -> None:
        z = torch.nn.functional.normalize(torch.randn(batch, 3), dim=1)
        z_pos = torch.nn.functional.normalize(z + 0.3 * torch.randn(batch, 3), dim=1)
        z_neg = torch.nn.functional.normalize(torch.randn(batch, 3), dim=1)
        with torch.no_grad():
            views = [generator(z), generator(z_pos), generator(z_neg)]
        a, p, n = (torch.nn.functional.normalize(h, dim=1) for h in encode_views(encoder, views))
        logits = torch.cat([(a * p).sum(1, keepdim=True), a @ n.T], 1) / settings.temperature
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(batch, dtype=torch.long))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    project = _steps_per_s(project_step, steps, warmup)
    with broadcast_loss():
        broadcast = _steps_per_s(project_step, steps, warmup)
    plain = _steps_per_s(plain_step, steps, warmup)
    return {"project": project, "broadcast": broadcast, "plain": plain}


def schedule(durations: list[float], jobs: int) -> float:
    """Makespan of longest-first list scheduling on ``jobs`` identical workers."""
    workers = [0.0] * jobs
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(workers, workers[0] + duration)
    return max(workers)


def merged(base: dict, overlay: dict) -> dict:
    """``overlay`` over ``base``, recursively (Snakemake's update of layered config files)."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = (
            merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config/config.yaml"))
    parser.add_argument("--steps", type=int, default=40, help="timed steps per kind of cell")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per kind of cell")
    parser.add_argument("--jobs", type=int, default=2, help="parallel cell jobs")
    parser.add_argument(
        "--job-overhead", type=float, default=4.0, help="CPU s per job outside training"
    )
    parser.add_argument(
        "--batches", type=int, nargs="*", default=[256, 2000], help="loop comparison batches"
    )
    parser.add_argument("--compare-steps", type=int, default=20, help="timed steps per loop")
    parser.add_argument("--no-grid", action="store_true", help="only the loop comparison")
    parser.add_argument("--overlay", help="a config layered over --config (snakemake --configfile)")
    parser.add_argument("--check", action="store_true", help="project identifiability.check")
    args = parser.parse_args()
    torch.set_num_threads(1)
    section = load_config(args.config)["identifiability"]
    if args.overlay:
        overlay = yaml.safe_load(Path(args.overlay).read_text()).get("identifiability", {})
        section = merged(section, overlay)  # the base is complete: the schema filled it
    if args.check:
        section = check_section(section)
    mlp = section["encoders"]["mlp"]
    print(f"loop comparison: MLP {mlp['variant']} {mlp['hidden']}, identity, restricted, "
          f"InfoNCE, negatives = batch; steps/s in CPU time, 1 torch thread")  # fmt: skip
    print(f"{'batch':>6}{'project':>10}{'broadcast':>11}{'plain':>9}"
          f"{'project/plain':>15}{'project/broadcast':>19}")  # fmt: skip
    for batch in args.batches:
        r = compare_loops(section, batch, args.compare_steps, 3)
        print(f"{batch:>6}{r['project']:>10.1f}{r['broadcast']:>11.1f}{r['plain']:>9.1f}"
              f"{r['project'] / r['plain']:>14.2f}x{r['project'] / r['broadcast']:>18.2f}x",
              flush=True)  # fmt: skip
    if args.no_grid:
        return
    print()
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
