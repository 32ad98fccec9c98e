"""The whole binding workflow on a GPU: a reduced paper config through the Snakemake DAG.

    benchmarks/gpu_e2e.sh [--json results/benchmarks/gpu_e2e.json] [--gpus N] [--cores 8]
    benchmarks/gpu_e2e.sh --tiny        # the same DAG at test size, seconds of work per job

It writes a config (:func:`e2e_config`): random-weight encoders of each kind the paper uses (timm
ViT and ConvNeXt, a torchvision ResNet, an open_clip ViT), two controls and two zoo runs, few
images, the paper's Jacobian settings otherwise (``--tiny``: a small ViT, the oracle and one zoo
run at 32 px); runs ``snakemake binding --cores C --resources
gpu=N`` on it in a work folder; then checks and reports (:func:`report`):

* ``device``: every embedding and Jacobian store and every zoo run says where it was computed;
  on a GPU machine each must say ``cuda``;
* ``slots``: the GPU slots the jobs held (their logs' ``holding`` / ``released`` lines) never
  overlap on one device, and no more were held at once than there are GPUs;
* ``cuda_vs_cpu``: the JER of the first probe images of one model recomputed here on the CPU
  against the store's (relative difference; at most ``JER_RTOL``);
* ``jobs``: each job's wall time from its log, the GPU jobs' total; ``zoo``: each run's
  steps/s; ``utilisation``: ``nvidia-smi`` sampled every ``SAMPLE_S`` during the run, its mean
  over the whole run and while only zoo training jobs ran (the GPU-busy share of training).

Without a GPU the same DAG runs on the CPU and the GPU-only checks print SKIP. The JSON is
rewritten at the end; a failed check exits 1 after writing it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = ("Snakefile", "rules", "workflow_scripts", "schemas", "profiles", "envs", "config")
SAMPLE_S = 0.5
JER_RTOL = 1e-4  # CUDA against CPU, float32 both (TF32 off): reduction order only
CHECK_MODEL = "vit_s16"  # the model whose JER is recomputed on the CPU
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
HOLD = re.compile(r"holding GPU slot of device (\S+) ")
RELEASE = re.compile(r"released GPU slot of device (\S+)")


def e2e_config(tiny: bool) -> dict[str, Any]:
    """The reduced paper config: ``tiny`` shrinks images, models and steps to test size."""
    size = 32 if tiny else 224
    small_vit = {"img_size": size, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
    timm_vit = {
        "source": "timm",
        "id": "vit_small_patch16_224",
        "family": "clustering_distillation",
    }
    models: dict[str, Any] = {
        "vit_s16": {**timm_vit, "kwargs": small_vit if tiny else {}},
        "shape_oracle": _control("shape_oracle", size),
        "simclr": {"source": "zoo", "id": "simclr", "family": "contrastive"},
    }
    zoo_run = {"backbone": "vit", "steps": 3 if tiny else 300, "batch_size": 8 if tiny else 256}
    zoo: dict[str, Any] = {"objectives": {"simclr": dict(zoo_run)}}
    if not tiny:  # the tiny DAG keeps one model of each kind of job: seconds in the tests
        models |= {
            "random_features": _control("random_features", size),
            "supervised": {"source": "zoo", "id": "supervised", "family": "supervised"},
            "convnext_t": {"source": "timm", "id": "convnext_tiny", "family": "supervised"},
            "resnet50": {"source": "torchvision", "id": "resnet50", "family": "supervised"},
            "clip_vit_b32": {"source": "open_clip", "id": "ViT-B-32", "family": "vision_language"},
        }
        zoo["objectives"]["supervised"] = dict(zoo_run)
    if tiny:
        zoo |= {
            "image_size": 32,
            "scenes": {"grid": [2, 2], "min_objects": 1, "max_objects": 4},
            "backbones": {"vit": {"timm_model": "vit_tiny_patch16_224", "timm_kwargs": {
                "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}}},
            "hparams": {"simclr": {"projector_dims": [64, 32]}},
        }  # fmt: skip
    binding = {"image_size": size, "n_queries": 16 if tiny else 64, "n_candidates": 8,
               "n_pairs": 16 if tiny else 64, "grid": [2, 2], "n_objects": 4}  # fmt: skip
    jacobians: dict[str, Any] = {"probes": {"binding": {"n": 2 if tiny else 8}}, "chunk_size": 2}
    if tiny:
        jacobians |= {"k": 8, "power_iters": 1, "batch_size": 64}
    return {
        "seed": 0,
        "device": "auto",
        "datasets": {"binding": binding},
        "models": models,
        "zoo": zoo,
        "jacobians": jacobians,
        "metrics": {
            "reference": {"image_sets": ["pair", "query"], "max_size": 200},
            "readouts": {"names": ["cosine", "knn"], "knn": {"k": 3}},
            "geometry": {"l_iso_k": [3, 5]},
        },
        "stats": {"n_bootstrap": 200},
        "sugarcrepe": {"enabled": False},
        "cifar": {"enabled": False},
        "alignment": {"real": {"pairs": []}},  # another study: not this DAG
    }


def _control(name: str, size: int) -> dict[str, Any]:
    return {"source": "python", "id": f"repdiag.binding.controls:{name}", "family": "control",
            "kwargs": {"image_size": size}}  # fmt: skip


def prepare(workdir: Path, config: dict[str, Any]) -> Path:
    """Copy the workflow into ``workdir`` and write the config there; the config's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        source, target = ROOT / part, workdir / part
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif source.exists():
            shutil.copy2(source, target)
    path = workdir / "config" / "e2e.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Sampler:
    """``nvidia-smi`` utilisation (percent, first visible GPU) every ``SAMPLE_S`` in a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                values = [float(v) for v in out.split()]
                if values:
                    self.samples.append((time.time(), float(np.mean(values))))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def run_dag(workdir: Path, config_path: Path, cores: int, gpus: int) -> tuple[int, float, str]:
    """``snakemake binding`` in ``workdir``: return code, wall seconds, the output's tail."""
    exe = Path(sys.executable).with_name("snakemake")
    command = [str(exe if exe.exists() else "snakemake"), "binding", "--cores", str(cores),
               f"--configfile={config_path}"]  # fmt: skip
    if gpus > 0:  # without GPUs the GPU jobs run on the CPU, `gpu` left unbounded
        command += ["--resources", f"gpu={gpus}"]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - start, (proc.stdout + proc.stderr)[-4000:]


def _stamp(line: str) -> float | None:
    match = STAMP.match(line)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def job_windows(logs: Path) -> list[dict[str, Any]]:
    """Each job's log: rule, name, first and last time stamp, GPU slot holds (device, start,
    end)."""
    jobs = []
    for path in sorted(logs.glob("*/*.log")):
        stamps, holds, open_holds = [], [], {}
        for line in path.read_text(errors="replace").splitlines():
            at = _stamp(line)
            if at is None:
                continue
            stamps.append(at)
            if hold := HOLD.search(line):
                open_holds[hold.group(1)] = at
            elif (release := RELEASE.search(line)) and release.group(1) in open_holds:
                holds.append((release.group(1), open_holds.pop(release.group(1)), at))
        holds += [(device, start, stamps[-1]) for device, start in open_holds.items()]
        if stamps:
            jobs.append({"rule": path.parent.name, "name": path.stem, "start": stamps[0],
                         "end": stamps[-1], "holds": holds})  # fmt: skip
    return jobs


def slot_check(jobs: list[dict[str, Any]], gpus: int) -> dict[str, Any]:
    """Holds on one device never overlap; at most ``gpus`` held at once."""
    holds = sorted((h for job in jobs for h in job["holds"]), key=lambda h: h[1])
    overlaps, most = [], 0
    for i, (device, start, _end) in enumerate(holds):
        live = [h for h in holds[:i] if h[2] > start]
        most = max(most, len(live) + 1)
        overlaps += [(device, start) for other, _, _ in live if other == device]
    ok = not overlaps and most <= max(gpus, 1)
    return {"holds": len(holds), "most_at_once": most if holds else 0,
            "overlaps": len(overlaps), "ok": ok}  # fmt: skip


def devices(workdir: Path) -> dict[str, dict[str, str]]:
    """Where each store and zoo run says it was computed."""
    import zarr

    found: dict[str, dict[str, str]] = {"embeddings": {}, "jacobians": {}, "zoo": {}}
    for stage in ("embeddings", "jacobians"):
        for store in sorted((workdir / "results" / stage).glob("*.zarr")):
            attrs = dict(zarr.open_group(str(store), mode="r").attrs)
            found[stage][store.stem] = str(attrs.get("device", "unknown"))
    for meta in sorted((workdir / "results" / "zoo").glob("*/meta.json")):
        found["zoo"][meta.parent.name] = str(json.loads(meta.read_text()).get("device"))
    return found


def zoo_rates(workdir: Path) -> dict[str, float]:
    """Steps per second of each zoo run (its meta.json: steps trained over wall time)."""
    rates = {}
    for meta in sorted((workdir / "results" / "zoo").glob("*/meta.json")):
        data = json.loads(meta.read_text())
        if data.get("wall_time_s"):
            rates[meta.parent.name] = data["steps_trained"] / data["wall_time_s"]
    return rates


def cuda_vs_cpu(workdir: Path, config_path: Path, model: str) -> dict[str, Any]:
    """The JER (pr) of ``model``'s first probe images at ``final`` and the taps derived from it,
    recomputed on the CPU in float32 with the job's settings, against its store."""
    import torch
    import xarray as xr

    from repdiag.api import load_config
    from repdiag.binding.jacobian_stage import load_probes
    from repdiag.encoders import build_encoder
    from repdiag.encoders.jacobian.engine import jacobian_spectra
    from repdiag.encoders.jacobian.jer import jer
    from repdiag.encoders.jacobian.options import JacobianSettings

    config = load_config(config_path)
    jacobians = JacobianSettings.from_config(config["jacobians"])
    store = xr.open_zarr(workdir / "results" / "jacobians" / f"{model}.zarr")
    stored_layers = [str(name) for name in store["layer"].values]
    layers = [name for name in ("final", "head") if name in stored_layers] or stored_layers[-1:]
    encoder = build_encoder(model, config["models"][model], zoo_dir=workdir / "results" / "zoo")
    dataset = workdir / "results" / "datasets" / "binding.zarr"
    probes = load_probes(jacobians.probes, encoder.preprocess, binding_store=dataset,
                         seed=jacobians.seed)  # fmt: skip
    n = jacobians.chunk_size
    engine = jacobians.engine() | {"precision": "fp32"}
    spectra = jacobian_spectra(encoder, probes.x[:n], layers, device=torch.device("cpu"),
                               **engine)  # fmt: skip
    worst = 0.0
    for layer in layers:
        here = jer(spectra[layer].double(), "pr", top_k=engine["k"]).numpy()
        stored = np.asarray(store["jer_pr"].sel(layer=layer).values[:n], dtype=float)
        worst = max(worst, float(np.max(np.abs(here - stored) / np.maximum(np.abs(stored), 1e-12))))
    return {"model": model, "layers": layers, "images": n, "max_rel_diff": worst,
            "ok": worst <= JER_RTOL}  # fmt: skip


def report(
    workdir: Path,
    config_path: Path,
    gpus: int,
    samples: list[tuple[float, float]],
    check_model: str = CHECK_MODEL,
) -> dict[str, Any]:
    """Every check and measurement of the module docstring over a finished run."""
    jobs = job_windows(workdir / "logs")
    on_gpu = gpus > 0
    where = devices(workdir)
    computed = [d for stage in where.values() for d in stage.values()]
    device_ok = all(d.startswith("cuda") for d in computed) if on_gpu else None
    zoo_jobs = [job for job in jobs if job["rule"].startswith("train_zoo")]
    result: dict[str, Any] = {
        "gpus": gpus,
        "device": {"stores": where, "all_cuda": device_ok},
        "slots": slot_check(jobs, gpus) if on_gpu else "SKIP (no GPU)",
        "cuda_vs_cpu": cuda_vs_cpu(workdir, config_path, check_model),
        "jobs": {
            f"{job['rule']}/{job['name']}": round(job["end"] - job["start"], 2) for job in jobs
        },
        "gpu_job_s": round(sum(e - s for job in jobs for _, s, e in job["holds"]), 2),
        "zoo_steps_per_s": zoo_rates(workdir),
        "utilisation": utilisation(samples, zoo_jobs, jobs) if samples else "SKIP (no nvidia-smi)",
    }
    if not on_gpu:
        result["cuda_vs_cpu"]["note"] = "SKIP (no GPU): CPU store against a CPU recomputation"
    return result


def utilisation(
    samples: list[tuple[float, float]], zoo_jobs: list[dict], jobs: list[dict]
) -> dict[str, Any]:
    """Mean GPU utilisation over the run, and over the samples when only zoo jobs ran."""
    values = np.array([v for _, v in samples])

    def running(at: float, group: list[dict]) -> bool:
        return any(job["start"] <= at <= job["end"] for job in group)

    others = [job for job in jobs if job not in zoo_jobs]
    zoo_only = [v for t, v in samples if running(t, zoo_jobs) and not running(t, others)]
    return {"samples": len(values), "mean_percent": float(values.mean()),
            "zoo_only_mean_percent": float(np.mean(zoo_only)) if zoo_only else None}  # fmt: skip


def verdict(result: dict[str, Any]) -> list[str]:
    """The names of the checks that failed."""
    failed = []
    if result["device"]["all_cuda"] is False:
        failed.append("device")
    if isinstance(result["slots"], dict) and not result["slots"]["ok"]:
        failed.append("slots")
    if not result["cuda_vs_cpu"]["ok"]:
        failed.append("cuda_vs_cpu")
    return failed


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="test-size config (CPU, seconds)")
    parser.add_argument("--gpus", type=int, default=None, help="default: the GPUs torch sees")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="run this config in --workdir, a copy of the workflow (default: write the reduced "
        "paper config there)",
    )
    parser.add_argument("--check-model", default=CHECK_MODEL, help="the model of cuda_vs_cpu")
    args = parser.parse_args(argv)
    gpus = _visible_gpus() if args.gpus is None else args.gpus
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="repdiag-e2e-"))
    if args.config is None:
        config_path = prepare(workdir, e2e_config(args.tiny))
    else:
        config_path = (workdir / args.config).resolve()
    print(f"gpu_e2e: {gpus} GPU(s), work folder {workdir}", flush=True)
    with Sampler() as sampler:
        code, wall, tail = run_dag(workdir, config_path, args.cores, gpus)
    if code != 0:
        print(tail, file=sys.stderr)
        print(f"gpu_e2e: snakemake failed ({code}) after {wall:.0f} s", file=sys.stderr)
        return code
    result = report(workdir, config_path, gpus, sampler.samples, args.check_model)
    result["wall_s"] = round(wall, 1)
    failed = verdict(result)
    result["failed"] = failed
    text = json.dumps(result, indent=2) + "\n"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(text)
    for check in ("device", "slots", "cuda_vs_cpu", "utilisation"):
        skipped = isinstance(result[check], str) or (
            check == "device" and result["device"]["all_cuda"] is None
        )
        print(f"{check}: {'FAIL' if check in failed else 'SKIP' if skipped else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
