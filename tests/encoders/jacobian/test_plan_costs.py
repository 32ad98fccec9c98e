"""The plan of one model (repdiag.encoders.jacobian.plan_costs): closed forms on an MLP, counted
runs of the engine on two small models, and the memory estimate against measured peaks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from repdiag.encoders.jacobian import plan_costs, plan_count
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.plan_costs import plan_model
from repdiag.encoders.jacobian.plan_count import flop_counter
from tests.encoders.jacobian.models import (
    D_IN,
    D_OUT,
    FWD,
    HIDDEN,
    by_name,
    encoder,
    engine,
    mlp,
    planning,
    tiny_resnet,
    tiny_vit,
)

torch.set_num_threads(1)


def test_exact_plan_of_an_mlp_is_d_out_vjps():
    plan = plan_model(
        mlp("meta"), (D_IN,), images=8, **planning(method="exact", batch_size=16, chunk_size=4)
    )
    taps = by_name(plan)
    assert (taps["output"].vjps, taps["output"].jvps) == (D_OUT, 0)
    assert taps["output"].flops == FWD + D_OUT * FWD
    assert taps["(d_out)"].flops == FWD / 4  # one forward on one image per call of 4 images
    assert plan.param_bytes == 4 * (D_IN * HIDDEN + HIDDEN + HIDDEN * D_OUT + D_OUT)
    # rows of J kept: n images x d_out x d_in floats, n = batch // d_out (at least 1)
    assert taps["output"].memory_bytes > plan.param_bytes + 1 * D_OUT * D_IN * 4
    assert taps["output"].linalg_flops == plan_count.svdvals_flops(D_OUT, D_IN)


@pytest.mark.parametrize(
    ("batch", "k", "chunk", "images", "per_call"),
    [(64, 4, 2, 32, 16), (64, 4, 2, 6, 6), (16, 8, 4, 8, 4), (8, 8, 4, 8, 4)],
)
def test_an_engine_call_takes_as_many_chunks_as_its_pass_holds(batch, k, chunk, images, per_call):
    """cache.run_chunked gives a call (batch // k) // chunk whole chunks, at least one, and never
    more images than there are: the per-call forward (d_out) is spread over that many images."""
    settings = planning(method="randomized", k=k, power_iters=1, batch_size=batch, chunk_size=chunk)
    plan = plan_model(mlp("meta"), (D_IN,), images=images, **settings)
    assert by_name(plan)["(d_out)"].flops == pytest.approx(FWD / per_call)


@pytest.mark.parametrize("k, q, batch", [(4, 1, 16), (8, 2, 4), (3, 0, 64)])
def test_randomized_plan_of_an_mlp_follows_subspace_iteration(k, q, batch):
    plan = plan_model(
        mlp("meta"),
        (D_IN,),
        **planning(method="randomized", k=k, power_iters=q, batch_size=batch, chunk_size=8),
    )
    taps = by_name(plan)
    n = min(max(1, batch // k), 8)  # images per pass
    calls = math.ceil(k / max(1, batch // n))  # vmap chunks of k directions
    assert (taps["(sketch)"].jvps, taps["(sketch)"].vjps) == (k, 0)
    # a vmapped JVP call runs the primal forward once (the tangent rules of linear make no
    # product with the weights' zero tangents), then one forward's FLOPs per direction
    assert taps["(sketch)"].flops == calls * FWD + k * FWD
    assert (taps["output"].jvps, taps["output"].vjps) == (q * k, (q + 1) * k)
    assert taps["output"].products + taps["(sketch)"].products == k * (2 * q + 2)
    expected = FWD + q * (calls * FWD + k * FWD) + (q + 1) * k * FWD
    assert taps["output"].flops == expected


def test_auto_keeps_derived_taps_exact_by_the_chain_rule():
    with torch.device("meta"):
        model = encoder(tiny_vit(), "cls")
    plan = plan_model(
        model, (3, 32, 32), **planning(k=8, power_iters=1, batch_size=64)
    )  # 32 <= k(2q+2)
    taps = by_name(plan)
    assert [taps[name].method for name in ("block00", "block01", "final", "head")] == [
        "exact",
        "exact",
        "chain",
        "chain",
    ]
    assert (taps["final"].parent, taps["head"].parent) == ("block01", "final")
    assert taps["final"].products == taps["head"].products == 0
    assert taps["block01"].vjps == 32


# ----------------------------------------------- the plan against counted runs of the engine

# The planner counts pieces of the network on the meta device and multiplies them by the
# engine's numbers of products; the check runs the engine itself on one random CPU image under
# the same counter. Both count the same dispatched ops, so they must agree to rounding: a missed
# forward or a wrong product count would be off by at least one forward pass (over 1% here).
CHECKS = [
    (tiny_vit, "cls", "auto", 8, 1),
    (tiny_vit, "cls", "randomized", 4, 1),
    (tiny_resnet, "mean", "exact", 4, 1),
    (tiny_resnet, "mean", "randomized", 2, 1),
]


@pytest.mark.parametrize("make, pooling, method, k, q", CHECKS)
def test_planned_flops_equal_a_counted_run_of_the_engine(make, pooling, method, k, q):
    torch.manual_seed(0)
    real = encoder(make(), pooling)
    with flop_counter() as counter:
        spectra = jacobian_spectra(
            real,
            torch.randn(1, 3, 32, 32),
            **engine(method=method, k=k, power_iters=q, batch_size=16),
        )
    with torch.device("meta"):
        meta = encoder(make(), pooling)
    plan = plan_model(
        meta,
        (3, 32, 32),
        **planning(method=method, k=k, power_iters=q, batch_size=16, chunk_size=1),
    )
    methods = {t.name: t.method for t in plan.taps if t.method not in ("setup", "sketch")}
    assert {name: "exact" if m == "chain" else m for name, m in methods.items()} == (
        spectra.methods
    )
    assert plan.flops_per_image == pytest.approx(counter.get_total_flops(), rel=1e-9)


# ------------------------------------------------------------ memory against measured peaks

MEASURED = Path(__file__).resolve().parents[3] / "benchmarks" / "measured" / "gpu-h200.json"


class _Taps:
    """The timm ViT behind the registry's taps, as benchmarks/gpu_steps.py measured it."""

    def __init__(self, model: torch.nn.Module) -> None:
        from repdiag.encoders.taps import tap_plan

        self.model, self.plan = model, tap_plan(model, "cls")
        self.layers, self.derived_taps = self.plan.layers, self.plan.derived

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        from repdiag.encoders.taps import run_taps

        return run_taps(self.plan, x, layers)


def _measured_rows() -> tuple[dict, list[dict]]:
    report = json.loads(MEASURED.read_text())
    return report, report["throughput"]


def test_the_memory_estimate_covers_every_measured_peak():
    """Every throughput row of the H200 run (ViT-B/16, every tap): the planner's memory of that
    pass (its method, products per pass and images) is at least 0.9 of the measured peak, and
    not more than twice it (no pass sized absurdly small). Uncalibrated it was 0.63-0.87."""
    import timm

    report, rows = _measured_rows()
    assert len(rows) >= 10 and report["model"] == "vit_base_patch16_224"
    with torch.device("meta"):
        vit = timm.create_model(report["model"], pretrained=False, num_classes=0).eval()
    taps, size = _Taps(vit), report["image_size"]
    plans: dict[tuple, float] = {}
    ratios = []
    for row in rows:
        key = (row["method"], row["batch_size"], row["images"])
        if key not in plans:
            plan = plan_model(
                taps, (3, size, size), method=row["method"], k=report["k"],
                power_iters=report["power_iters"], batch_size=row["batch_size"],
                chunk_size=row["images"], images=row["images"],
            )  # fmt: skip
            plans[key] = plan.peak_memory_bytes
        ratios.append(plans[key] / (row["peak_mib"] * 2**20))
    assert min(ratios) >= 0.9 and max(ratios) <= 2.0, ratios
    # the calibration put back to 1 (the break): the estimate falls short of the peaks again
    uncalibrated = [
        ((plans[(r["method"], r["batch_size"], r["images"])] - vit_bytes(vit))
         / plan_costs.MEMORY_CALIBRATION + vit_bytes(vit)) / (r["peak_mib"] * 2**20)
        for r in rows
    ]  # fmt: skip
    assert min(uncalibrated) < 0.7


def vit_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
