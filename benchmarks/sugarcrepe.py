"""Benchmark of SugarCrepe scoring against the per-example loop of SugarCrepe's own evaluation.

A random-weight open_clip ``ViT-S-32-alt`` (the smallest built-in architecture) and a synthetic
SugarCrepe in the real format: ``--images`` COCO-sized JPEGs (640 x 480), each used by
``--reuse`` examples spread over the seven categories (real SugarCrepe: ~7.5k examples on ~5k
images, many images and captions shared), in one process:

* ``per_example``: for each example, open and transform its image, embed it, tokenize and embed
  its two captions (batch of 2), compare: the loop of SugarCrepe's reference script;
* ``scored``: :func:`repdiag.sugarcrepe.scoring.score_examples`: every distinct image and caption
  embedded once, in batches of ``--batch-size``.

Both give the same scores (checked, atol 1e-4). Each runs ``--repeats`` rounds in alternating
order (the machine is shared); prints the best time of each and the median within-round ratio
``per_example / scored`` (the speed-up). Example: ``.venv/bin/python benchmarks/sugarcrepe.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from PIL import Image

from repdiag.core.store import write_text
from repdiag.sugarcrepe.data import CATEGORIES, load_examples
from repdiag.sugarcrepe.scoring import build_image_text_model, score_examples


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=24, help="distinct images")
    parser.add_argument("--reuse", type=int, default=3, help="examples per image")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    return parser.parse_args()


def write_data(root: Path, n_images: int, reuse: int) -> None:
    rng = np.random.default_rng(0)
    (root / "val2017").mkdir(parents=True)
    (root / "data").mkdir()
    for i in range(n_images):
        pixels = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "val2017" / f"{i:012d}.jpg", quality=90)
    records: dict[str, dict[str, dict[str, str]]] = {c: {} for c in CATEGORIES}
    for n in range(n_images * reuse):
        i, category = n % n_images, CATEGORIES[n % len(CATEGORIES)]
        records[category][str(n)] = {
            "filename": f"{i:012d}.jpg",
            "caption": f"a photo of object {i} on a table",
            "negative_caption": f"a photo of a table on object {i} ({category})",
        }
    for category, data in records.items():
        (root / "data" / f"{category}.json").write_text(json.dumps(data))


@torch.no_grad()
def per_example(model, examples, images: Path) -> np.ndarray:
    scores = []
    for example in examples:
        with Image.open(images / example.filename) as image:
            f = model.encode_images([image.convert("RGB")])
        t = model.encode_texts([example.caption, example.negative_caption])
        scores.append((f @ t.T)[0].numpy())
    return np.array(scores)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model = build_image_text_model(
        "bench", {"source": "open_clip", "id": "ViT-S-32-alt", "family": "vision_language"}, seed=0
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_data(root, args.images, args.reuse)
        examples = load_examples(root / "data", root / "val2017")
        images = root / "val2017"
        naive = per_example(model, examples, images)  # warm-up and the reference scores
        ours = score_examples(model, examples, images, args.batch_size)
        np.testing.assert_allclose(naive[:, 0], ours.positive, atol=1e-4)
        np.testing.assert_allclose(naive[:, 1], ours.negative, atol=1e-4)
        times: dict[str, list[float]] = {"per_example": [], "scored": []}
        runs = {
            "per_example": lambda: per_example(model, examples, images),
            "scored": lambda: score_examples(model, examples, images, args.batch_size),
        }
        for round_index in range(args.repeats):
            order = list(runs) if round_index % 2 == 0 else list(runs)[::-1]
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
    ratio = statistics.median(
        a / b for a, b in zip(times["per_example"], times["scored"], strict=True)
    )
    result = {
        "examples": len(examples),
        "images": args.images,
        "threads": args.threads,
        "per_example_s": min(times["per_example"]),
        "scored_s": min(times["scored"]),
        "examples_per_s": len(examples) / min(times["scored"]),
        "speedup": ratio,
    }
    for key, value in result.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        write_text(args.json, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
