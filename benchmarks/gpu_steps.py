"""The measured steps of benchmarks/gpu.py: FLOP counts, throughput over batch sizes, reduced
precisions, bitwise repeatability and the shortcut-free open_clip encoder. Each step asks the
budget first and is listed in ``skipped`` when its estimate would overrun it."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from jacobian import RegistryTaps, count_flops, measure  # benchmarks/jacobian.py

from repdiag.encoders.jacobian.engine import jacobian_spectra

PRECISION_COST = {"fp32": 1.0, "tf32": 0.6, "bf16": 0.6}  # time relative to FP32, for estimates


class Budget:
    """Wall-clock budget: a step runs only when its estimate fits in what is left.
    ``seconds=None`` (the tiny run) is unbounded: every step runs, so what runs never depends
    on the machine's speed."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds, self.start = seconds, time.monotonic()

    @property
    def used(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float | None:
        """Seconds left, or None when unbounded."""
        return None if self.seconds is None else max(0.0, self.seconds - self.used)

    def allows(self, estimate_s: float) -> bool:
        return self.seconds is None or self.used + estimate_s <= self.seconds


class Fallbacks:
    """Collects torch's "no batching rule" warnings (the per-sample vmap fallback) by op."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        torch._C._functorch._set_vmap_fallback_warning_enabled(True)

    def run(self, fn: Callable[[], Any]) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
        for warning in caught:
            text = str(warning.message)
            if "batching rule" in text:
                self.ops.add(text.split("batching rule for ")[-1].split(".")[0])
        return result


def vit(size: dict[str, Any]) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    spec = size["vit"]
    return timm.create_model(spec["name"], pretrained=False, num_classes=0, **spec["kwargs"]).eval()


def open_clip_visual(size: dict[str, Any]) -> torch.nn.Module:
    import open_clip
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(1)
    spec = size["open_clip"]
    if "name" in spec:
        return open_clip.create_model(spec["name"], pretrained=None).visual.eval()
    return VisionTransformer(mlp_ratio=2.0, output_dim=16, **spec).eval()


def probe_images(n: int, size: int) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(7))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def products_per_pass(method_of: dict[str, str], d_out: dict[str, int], n: int, k: int, bs: int):
    """Jacobian-vector products in the engine's largest vmapped call (see jacobian_spectra)."""
    widest = {"exact": 0, "randomized": 0}
    for layer, method in method_of.items():
        if method == "exact":
            per_pass = max(1, bs // d_out[layer])
            widest["exact"] = max(widest["exact"], min(bs, min(per_pass, n) * d_out[layer]))
        else:
            widest["randomized"] = max(widest["randomized"], min(bs, min(bs // k or 1, n) * k))
    return widest


@dataclass
class Steps:
    """One benchmark run's state: the report it fills, the budget, and the per-image time
    estimates (``per_image``, seconds by method) that the next steps are budgeted with."""

    report: dict[str, Any]
    save: Callable[[], None]
    budget: Budget
    fallbacks: Fallbacks
    device: torch.device
    size: dict[str, Any]
    per_image: dict[str, float] = field(default_factory=dict)
    methods_of: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.k, self.q = self.size["k"], self.size["power_iters"]
        self.taps = RegistryTaps(vit(self.size).to(self.device))
        n_max = max(self.size["images"].values())
        self.x = probe_images(n_max, self.size["size"]).to(self.device)

    def engine(self, method: str, n: int, bs: int | None, precision: str = "fp32"):
        return jacobian_spectra(
            self.taps,
            self.x[:n],
            method=method,
            k=self.k,
            power_iters=self.q,
            seed=0,
            batch_size=bs,
            device=self.device,
            precision=precision,
        )

    def estimate(self, method: str, n: int, precision: str) -> float:
        return self.per_image.get(method, 0.0) * n * PRECISION_COST[precision]

    def skip(self, what: str) -> None:
        self.report["skipped"].append(what)

    def timed(self, method: str, n: int, bs: int | None, precision: str = "fp32"):
        """(wall seconds, peak MiB) of one engine call, vmap fallbacks recorded."""
        _, wall, peak = measure(
            lambda: self.fallbacks.run(lambda: self.engine(method, n, bs, precision)), self.device
        )
        return wall, peak

    def rates(self, method: str, precision: str, n: int, wall: float, peak: float) -> dict:
        tflop = self.report["flops"][method]["tflop_per_image"] * n / wall
        return {
            "s": wall,
            "images_per_s": n / wall,
            "peak_mib": peak,
            "tflops": tflop,
            "fraction_of_matmul": tflop / self.report["matmul"][precision]["tflops"],
        }


def count_method_flops(steps: Steps) -> None:
    """FLOPs per image of each method, counted on one image (also the warm-up), and a first
    estimate of seconds per image for the budget."""
    for method in ("exact", "randomized", "auto"):
        if steps.per_image and not steps.budget.allows(max(steps.per_image.values()) * 1.5):
            steps.skip(f"flop count {method}")
            continue
        start = time.perf_counter()
        captured: dict[str, Any] = {}

        def counted(method: str = method, captured: dict = captured) -> None:
            captured["s"] = steps.fallbacks.run(lambda: steps.engine(method, 1, None))

        flops = count_flops(counted)
        sync(steps.device)
        steps.per_image[method] = time.perf_counter() - start
        steps.methods_of[method] = dict(captured["s"].methods)
        steps.report["flops"][method] = {
            "tflop_per_image": flops / 1e12,
            "methods": steps.methods_of[method],
            "d_out": dict(captured["s"].d_out),
        }
        steps.save()


def measure_throughput(steps: Steps, batch_sizes: list[int]) -> None:
    """Images per second of each method in FP32 at each batch size; a run whose work equals an
    earlier one (same method per layer, same products per pass) is recorded as ``same_as``."""
    done: dict[tuple, dict[str, Any]] = {}
    for method in ("auto", "exact", "randomized"):
        if method not in steps.methods_of:
            continue
        for bs in batch_sizes:
            n = steps.size["images"][method]
            d_out = steps.report["flops"][method]["d_out"]
            per_pass = products_per_pass(steps.methods_of[method], d_out, n, steps.k, bs)
            key = (json.dumps(steps.methods_of[method], sort_keys=True), json.dumps(per_pass), n)
            row = {"method": method, "precision": "fp32", "batch_size": bs, "images": n}
            row["products_per_pass"] = per_pass
            if key in done:
                row |= {f: done[key][f] for f in ("images_per_s", "peak_mib", "fraction_of_matmul")}
                row["same_as"] = {f: done[key][f] for f in ("method", "batch_size")}
                steps.report["throughput"].append(row)
                continue
            estimate = steps.estimate(method, n, "fp32")
            if not steps.budget.allows(estimate):
                steps.skip(f"throughput {method} batch {bs} ({estimate:.0f} s)")
                continue
            try:
                wall, peak = steps.timed(method, n, bs)
            except torch.OutOfMemoryError:
                if steps.device.type == "cuda":
                    torch.cuda.empty_cache()
                steps.skip(f"throughput {method} batch {bs} (out of memory)")
                steps.save()
                continue
            steps.per_image[method] = wall / n
            row |= steps.rates(method, "fp32", n, wall, peak)
            done[key] = row
            steps.report["throughput"].append(row)
            steps.save()


def measure_precisions(steps: Steps) -> None:
    """``auto`` in TF32 and BF16 at the fastest FP32 batch size."""
    auto_rows = [r for r in steps.report["throughput"] if r["method"] == "auto" and "s" in r]
    if not auto_rows:
        return
    best = max(auto_rows, key=lambda r: r["images_per_s"])
    n, bs = best["images"], best["batch_size"]
    for precision in ("tf32", "bf16"):
        estimate = steps.estimate("auto", n, precision)
        if not steps.budget.allows(estimate):
            steps.skip(f"throughput auto {precision} ({estimate:.0f} s)")
            continue
        wall, peak = steps.timed("auto", n, bs, precision)
        row = {"method": "auto", "precision": precision, "batch_size": bs, "images": n}
        steps.report["throughput"].append(row | steps.rates("auto", precision, n, wall, peak))
        steps.save()


def measure_repeatability(steps: Steps) -> None:
    """Whether the same run twice gives equal spectra bit for bit, in FP32 and TF32."""
    for precision in ("fp32", "tf32"):
        if not steps.budget.allows(2 * steps.estimate("auto", 1, precision)):
            steps.skip(f"repeatability {precision}")
            continue
        first = steps.engine("auto", 1, None, precision)
        second = steps.engine("auto", 1, None, precision)
        steps.report["repeatable"][precision] = all(
            torch.equal(first[name], second[name]) for name in first
        )
        steps.save()


def measure_other_encoder(steps: Steps) -> None:
    """An encoder without the shortcuts: open_clip's ViT (no class-token block, no derived taps)."""
    other_taps = RegistryTaps(open_clip_visual(steps.size).to(steps.device))
    result = steps.report["other_encoder"]
    if other_taps.derived_taps or any(t.pooled_forward for t in other_taps.plan.blocks):
        result["error"] = "expected no shortcuts"
    if not steps.budget.allows(steps.estimate("auto", 2, "fp32") / 2):
        steps.skip("other encoder")
        steps.save()
        return
    xo = probe_images(2, steps.size["size"]).to(steps.device)
    captured: dict[str, Any] = {}

    def run() -> None:
        captured["spectra"] = steps.fallbacks.run(
            lambda: jacobian_spectra(
                other_taps,
                xo,
                method="auto",
                k=steps.k,
                power_iters=steps.q,
                seed=0,
                device=steps.device,
                precision="fp32",
            )
        )

    _, wall, peak = measure(run, steps.device)
    result |= {
        "model": steps.size["open_clip"].get("name", "open_clip VisionTransformer (tiny)"),
        "layers": len(other_taps.layers),
        "derived_taps": sorted(other_taps.derived_taps),
        "methods": dict(captured["spectra"].methods),
        "images": 2,
        "images_per_s": 2 / wall,
        "peak_mib": peak,
    }
    steps.save()
