"""Benchmark: a zoo ResNet's Jacobian spectra with and without the chain-rule taps, and a
ResNet-50 tap with and without global pooling as a spatial mean.

The embedded zoo's backbone (timm ``resnet10t``, channels 32-64-128-256, 64 px) with a VICReg
projection head (256 -> 512 -> 512, batch norm, ReLU), random weights, every tap. The baseline
differentiates each tap through the whole network, as the engine did before: ``final`` by its
own 256 VJPs and the 512-wide ``head`` by randomized subspace iteration (k = 32, q = 5). Ours:
``final`` is the last stage's tap (timm's ``forward_head`` is its global average) and the head
comes from the chain rule on the last stage's QR factor, exact. Both run in this process on the
same images; the best of ``--repeats`` interleaved rounds is kept. Prints seconds per image, the
ratio, and how far apart the two methods' JERs are (the head differs: exact vs randomized).
Example (about 1 min on 2 cores): ``.venv/bin/python benchmarks/jacobian_cnn.py --images 4``.

``--part resnet50``: timm ``resnet50`` (random weights, 224 px), its ``final`` tap alone (so it is
differentiated through timm's global pooling, not derived from ``stage3``), randomized
(``--k``, ``--power-iters``). Before: the pooling as timm calls it, ``adaptive_avg_pool2d``; after:
the engine's rewrite, a mean over the spatial dimensions. Both in contiguous (NCHW) and in
channels-last memory (as GPUs run CNNs, and as ConvNeXt's blocks leave their output), where
``adaptive_avg_pool2d``'s forward-mode derivative has no batching rule (``as_strided_``) and
vmap falls back to a loop. Prints seconds per image, the ratio, the ops that fell back, and the
largest difference between the spectra. ``--part all`` runs both parts.
"""

from __future__ import annotations

import argparse
import time
import warnings

import timm
import torch

from repdiag.encoders.heads import WithHead
from repdiag.encoders.jacobian import rewrites
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer
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


def fallback_ops(fn):
    """``fn()`` and the ops torch reported running without a batching rule (vmap's loop)."""
    torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
    finally:
        torch._C._functorch._set_vmap_fallback_warning_enabled(False)
    ops = {
        str(w.message).split("batching rule for ")[-1].split(".")[0]
        for w in caught
        if "batching rule" in str(w.message)
    }
    return result, sorted(ops)


def resnet50_pooling(args: argparse.Namespace) -> dict:
    """The ResNet-50 ``final`` tap with timm's adaptive pooling (before) and as a mean (after)."""
    torch.manual_seed(0)
    model = timm.create_model("resnet50", pretrained=False, num_classes=0).eval()
    x = torch.rand(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    results = {}
    for layout, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
        model = model.to(memory_format=fmt)
        encoder, inputs = Taps(model, chain=True), x.contiguous(memory_format=fmt)
        best, spectra, ops = {}, {}, {}
        for _ in range(args.repeats):
            for name, rewrite in (("before", False), ("after", True)):
                rewrites._JacobianRewrites.global_pool = rewrite
                try:
                    start = time.perf_counter()
                    spectra[name], ops[name] = fallback_ops(
                        lambda encoder=encoder, inputs=inputs: jacobian_spectra(
                            encoder,
                            inputs,
                            layers=["final"],
                            method="randomized",
                            k=args.k,
                            power_iters=args.power_iters,
                            seed=0,
                            precision="fp32",
                        )
                    )
                    seconds = (time.perf_counter() - start) / args.images
                finally:
                    rewrites._JacobianRewrites.global_pool = True
                best[name] = min(best.get(name, float("inf")), seconds)
        a, b = spectra["before"]["final"], spectra["after"]["final"]
        results[layout] = {
            "before_s": best["before"],
            "after_s": best["after"],
            "ratio": best["before"] / best["after"],
            "fallbacks": ops,
            "max_rel_diff": float((a - b).abs().max() / a.abs().max()),
        }
        print(
            f"ResNet-50 final tap, {layout}: before (adaptive_avg_pool2d) {best['before']:.2f} "
            f"s/image, vmap fallbacks {ops['before'] or 'none'}; after (spatial mean) "
            f"{best['after']:.2f} s/image, fallbacks {ops['after'] or 'none'}; ratio "
            f"{results[layout]['ratio']:.2f}x; max relative difference of the spectra "
            f"{results[layout]['max_rel_diff']:.1e}",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--part", choices=("zoo", "resnet50", "all"), default="zoo")
    parser.add_argument("--k", type=int, default=8, help="resnet50 part: directions")
    parser.add_argument("--power-iters", type=int, default=1, help="resnet50 part: rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("resnet50", "all"):
        resnet50_pooling(args)
    if args.part == "resnet50":
        return
    model = zoo_resnet()
    x = torch.rand(args.images, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    runs = {"baseline (no chain rule)": Taps(model, chain=False), "ours": Taps(model, chain=True)}
    best = {name: float("inf") for name in runs}
    spectra = {}
    for _ in range(args.repeats):
        for name, encoder in runs.items():
            start = time.perf_counter()
            spectra[name] = jacobian_spectra(
                encoder, x, method="auto", k=32, power_iters=5, seed=0, precision="fp32"
            )
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
