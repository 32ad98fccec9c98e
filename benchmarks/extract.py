"""Benchmark of embedding extraction against a bare forward loop, on the same model and images.

One timm ViT (6 blocks, width 192, 64 px, patch 16, random weights) and a few hundred uint8
images, in one process:

* ``bare``: ``model(x)`` under ``torch.inference_mode`` over batches of already preprocessed
  tensors (the floor: the forward pass and nothing else);
* ``bare+preprocess``: the same loop, preprocessing each uint8 batch first;
* ``taps``: :func:`repdiag.encoders.embeddings.extract_embeddings` alone (preprocess, every tap
  pooled, copied to numpy, finiteness checked, Dataset built);
* ``extract``: the same plus :func:`write_embeddings` (zarr v3 store with provenance, atomic
  rename): what the rule does once the model is built.

Each runs ``--repeats`` rounds, interleaved with alternating order (the machine is shared); the
ratios are the median over rounds of the within-round ratio, the times the best round.
Prints both and ``extract / bare`` (target < 1.15). Writing a store costs a fixed ~0.1-0.2 s
(array creation, consolidated metadata, provenance), so the ratio falls with the image count; the
default, 2816 images, is what the embedded default config extracts per model (256 queries, 8
candidates each, 256 pairs). Example: ``.venv/bin/python benchmarks/extract.py`` (about 90 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from repdiag.core.store import write_text
from repdiag.encoders import build_encoder
from repdiag.encoders.embeddings import extract_embeddings, write_embeddings


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--images",
        type=int,
        default=2816,
        help="images per run (default: the embedded default's 2816 images per model)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=64, help="image side, pixels")
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    return parser.parse_args()


def timed_rounds(repeats: int, runs: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    """Wall time of every run in each of ``repeats`` rounds (after one warm-up round).

    The order of the runs alternates between rounds so that a drift in the machine's load
    (it is shared) biases no run; ratios are then taken within a round.
    """
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            runs[name]()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    entry = {
        "source": "timm",
        "id": "vit_tiny_patch16_224",
        "family": "other",
        "kwargs": {
            "img_size": args.size,
            "depth": args.depth,
            "embed_dim": args.width,
            "num_heads": 3,
        },
    }
    encoder = build_encoder("bench_vit", entry).to(device)
    model = encoder.model
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(args.images, args.size, args.size, 3), dtype=np.uint8)
    image_sets = {"query": ([f"query/q{i:05d}" for i in range(args.images)], images)}
    batches = [images[lo : lo + args.batch_size] for lo in range(0, args.images, args.batch_size)]
    prepared = [encoder.preprocess(torch.from_numpy(b).to(device)) for b in batches]
    scratch = Path(tempfile.mkdtemp(prefix="bench_extract_"))

    def bare() -> None:
        with torch.inference_mode():
            for x in prepared:
                model(x)

    def bare_preprocess() -> None:
        with torch.inference_mode():
            for batch in batches:
                model(encoder.preprocess(torch.from_numpy(batch).to(device)))

    def taps() -> None:
        extract_embeddings(encoder, image_sets, batch_size=args.batch_size, device=device)

    def extract() -> None:
        ds = extract_embeddings(encoder, image_sets, batch_size=args.batch_size, device=device)
        write_embeddings(scratch / "bench.zarr", ds, config={"models": {"bench_vit": entry}})

    runs = {"bare": bare, "bare+preprocess": bare_preprocess, "taps": taps, "extract": extract}
    try:
        rounds = timed_rounds(args.repeats, runs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    best = {name: min(values) for name, values in rounds.items()}

    def paired(name: str, base: str) -> float:
        return float(np.median(np.array(rounds[name]) / np.array(rounds[base])))

    result = {
        "model": f"timm ViT depth {args.depth} width {args.width} at {args.size} px",
        "images": args.images,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "device": str(device),
        "layers": encoder.layers,
        "best_seconds": best,
        "rounds_seconds": rounds,
        "ratio_taps_over_bare": paired("taps", "bare"),
        "ratio_extract_over_bare": paired("extract", "bare"),
        "ratio_extract_over_bare_preprocess": paired("extract", "bare+preprocess"),
    }
    for name, seconds in best.items():
        print(
            f"{name:>16}: {seconds:7.3f} s best of {args.repeats}  ({args.images / seconds:7.1f} images/s)"
        )
    print("median of the per-round ratios:")
    print(f"  taps / bare               = {result['ratio_taps_over_bare']:.3f}")
    print(f"  extract / bare            = {result['ratio_extract_over_bare']:.3f}  (target < 1.15)")
    print(f"  extract / bare+preprocess = {result['ratio_extract_over_bare_preprocess']:.3f}")
    if args.json:
        write_text(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
