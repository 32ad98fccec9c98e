"""Benchmark: a zoo ResNet's Jacobian spectra with and without the chain-rule taps.

The embedded zoo's backbone (timm ``resnet10t``, channels 32-64-128-256, 64 px) with a VICReg
projection head (256 -> 512 -> 512, batch norm, ReLU), random weights, every tap. The baseline
differentiates each tap through the whole network, as the engine did before: ``final`` by its
own 256 VJPs and the 512-wide ``head`` by randomized subspace iteration (k = 32, q = 5). Ours:
``final`` is the last stage's tap (timm's ``forward_head`` is its global average) and the head
comes from the chain rule on the last stage's QR factor, exact. Both run in this process on the
same images; the best of ``--repeats`` interleaved rounds is kept. Prints seconds per image, the
ratio, and how far apart the two methods' JERs are (the head differs: exact vs randomized).
Example (about 1 min on 2 cores): ``.venv/bin/python benchmarks/jacobian_cnn.py --images 4``.
"""

from __future__ import annotations

import argparse
import time

import timm
import torch

from repdiag.binding.jacobian import jacobian_spectra, jer
from repdiag.encoders.heads import WithHead
from repdiag.encoders.taps import run_taps, tap_plan
from repdiag.encoders.zoo.heads import MLPHead


class Taps:
    """The registry's encoder interface (layers, layer_outputs, derived_taps) over one plan."""

    def __init__(self, model: torch.nn.Module, chain: bool) -> None:
        self.model = model
        self.plan = tap_plan(model, "mean")
        self.layers = self.plan.layers
        self.derived_taps = dict(self.plan.derived) if chain else {}

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        return run_taps(self.plan, x, layers)


def zoo_resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    backbone = timm.create_model(
        "resnet10t", pretrained=False, num_classes=0, channels=(32, 64, 128, 256), stem_width=16
    )
    head = MLPHead([256, 512, 512], norm="batch", activation="relu")
    return WithHead(backbone, head).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo_resnet()
    x = torch.rand(args.images, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    runs = {"baseline (no chain rule)": Taps(model, chain=False), "ours": Taps(model, chain=True)}
    best = {name: float("inf") for name in runs}
    spectra = {}
    for _ in range(args.repeats):
        for name, encoder in runs.items():
            start = time.perf_counter()
            spectra[name] = jacobian_spectra(encoder, x, method="auto", k=32, power_iters=5)
            best[name] = min(best[name], (time.perf_counter() - start) / args.images)
    for name, seconds in best.items():
        print(f"{name}: {seconds:.3f} s per image, methods {spectra[name].methods}")
    base, ours = runs
    print(f"speed-up: {best[base] / best[ours]:.2f}x ({args.images} images, {args.threads} thread)")
    for layer in runs[ours].layers:
        a = jer(spectra[base][layer], top_k=32)
        b = jer(spectra[ours][layer], top_k=32)
        print(f"  {layer}: max |JER difference| {float((a - b).abs().max()):.2e}")


if __name__ == "__main__":
    main()
