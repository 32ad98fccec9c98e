"""Benchmark: JER error of each ``jacobians.precision`` against float64 on the default zoo model.

The default zoo's backbone (timm ``resnet10t``, channels 32-64-128-256, 64 px) with a VICReg
projection head (256 -> 512 -> 512), random weights (the workflow trains the zoo; a trained
checkpoint can be given with ``--zoo-run results/zoo/<name>``), every tap, ``auto`` with k = 32,
q = 5 (every tap is exact here: the stages are at most 256 wide and ``final`` and ``head`` come by
the chain rule). The reference is the same model and images in float64; then ``fp32``, ``tf32``
and ``bf16`` on ``--device``. Prints, per precision, the largest and the mean relative JER error
over images and taps and the seconds per image; ``--json`` writes it. On a CPU ``tf32`` is
``fp32`` (no TF32 units), which the printed effective precision says.
Example (about 1 min on 2 cores): ``.venv/bin/python benchmarks/precision.py --images 8``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from repdiag.core.store import write_text
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer


def zoo_model(run: Path | None) -> tuple[torch.nn.Module, str]:
    if run is not None:
        from repdiag.encoders.heads import WithHead
        from repdiag.encoders.zoo.checkpoint import load_zoo_model

        loaded = load_zoo_model(run, "cpu")
        return WithHead(loaded.backbone, loaded.head).eval(), f"trained zoo run {run}"
    from jacobian_cnn import zoo_resnet  # benchmarks/jacobian_cnn.py

    return zoo_resnet(), "zoo ResNet (resnet10t + VICReg head), random weights"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--zoo-run", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from jacobian_cnn import Taps  # the registry's taps over one plan

    model, what = zoo_model(args.zoo_run)
    x = torch.rand(args.images, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    engine = {"method": "auto", "k": 32, "power_iters": 5, "seed": 0}
    start = time.perf_counter()
    reference = jacobian_spectra(
        Taps(copy.deepcopy(model).double(), True), x.double(), precision="fp32", **engine
    )
    report = {
        "model": what,
        "device": args.device,
        "images": args.images,
        "threads": torch.get_num_threads(),
        "methods": reference.methods,
        "fp64_s_per_image": (time.perf_counter() - start) / args.images,
    }
    print(f"{what}; {args.images} images; methods {reference.methods}")
    want = {layer: jer(values, top_k=32) for layer, values in reference.items()}
    for precision in ("fp32", "tf32", "bf16"):
        encoder = Taps(copy.deepcopy(model).float(), True)
        start = time.perf_counter()
        spectra = jacobian_spectra(encoder, x, device=args.device, precision=precision, **engine)
        seconds = (time.perf_counter() - start) / args.images
        errors = {
            layer: (jer(spectra[layer].double(), top_k=32) - want[layer]).abs() / want[layer]
            for layer in want
        }
        row = {
            "effective": spectra.numerics["precision_effective"],
            "max_rel_jer_error": max(float(e.max()) for e in errors.values()),
            "mean_rel_jer_error": float(torch.cat(list(errors.values())).mean()),
            "per_layer_max": {layer: float(e.max()) for layer, e in errors.items()},
            "s_per_image": seconds,
        }
        report[precision] = row
        print(
            f"{precision} (computes in {row['effective']}): JER relative error vs float64 max "
            f"{row['max_rel_jer_error']:.1e}, mean {row['mean_rel_jer_error']:.1e}; "
            f"{seconds:.2f} s/image; per tap {json.dumps(row['per_layer_max'])}",
            flush=True,
        )
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
