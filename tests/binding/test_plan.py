"""The Jacobian cost planner: closed forms on an MLP, counted runs of the engine on two small
models, models built on the meta device from config entries, and the printed plan."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from torch import nn

from repdiag.binding import plan as planner
from repdiag.binding.jacobian import jacobian_spectra
from repdiag.binding.plan import flop_counter, plan_model
from repdiag.encoders.preprocess import Preprocess
from repdiag.encoders.registry import Encoder
from repdiag.encoders.taps import tap_plan

torch.set_num_threads(1)

D_IN, HIDDEN, D_OUT = 12, 16, 40
# one forward of the MLP: 2 FLOPs per multiply-add of its two matmuls
FWD = 2 * (D_IN * HIDDEN + HIDDEN * D_OUT)


def mlp(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, D_OUT))
    return model.requires_grad_(False)


def tiny_vit() -> nn.Module:
    """2 blocks, width 32, 8 px patches at 32 px, a 10-way head: a class-token ViT whose final
    and head taps are derived (chain rule) and whose blocks use the class-token shortcut."""
    return timm.create_model(
        "vit_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=2.0,
        num_classes=10,
    )


def tiny_resnet() -> nn.Module:
    """resnet10t with narrow stages: final is derived from the last stage, head from final."""
    return timm.create_model("resnet10t", channels=[8, 16, 16, 32], stem_width=8, num_classes=10)


def encoder(model: nn.Module, pooling: str) -> Encoder:
    model.eval().requires_grad_(False)
    preprocess = Preprocess(32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear")
    return Encoder("m", "timm", "x", model, preprocess, pooling, tap_plan(model, pooling))


def by_name(plan: planner.ModelPlan) -> dict[str, planner.TapCost]:
    return {tap.name: tap for tap in plan.taps}


# ------------------------------------------------------------------------ closed forms (MLP)


def test_unit_costs_of_an_mlp_are_its_matmuls():
    units = planner.measure(mlp("meta"), torch.zeros(1, D_IN, device="meta"))
    assert units.fwd == FWD
    assert units.vjp == FWD  # input gradients only: one product per weight matrix
    assert units.jvp == FWD  # one more tangent direction: its products with the weights
    # once per vmapped call: the primal forward and functorch's primal x zero-weight-tangent mms
    assert units.jvp_call == 2 * FWD


def test_exact_plan_of_an_mlp_is_d_out_vjps():
    plan = plan_model(mlp("meta"), (D_IN,), method="exact", batch_size=16, chunk_size=4)
    taps = by_name(plan)
    assert (taps["output"].vjps, taps["output"].jvps) == (D_OUT, 0)
    assert taps["output"].flops == FWD + D_OUT * FWD
    assert taps["(d_out)"].flops == FWD / 4  # one forward on one image per call of 4 images
    assert plan.param_bytes == 4 * (D_IN * HIDDEN + HIDDEN + HIDDEN * D_OUT + D_OUT)
    # rows of J kept: n images x d_out x d_in floats, n = batch // d_out (at least 1)
    assert taps["output"].memory_bytes > plan.param_bytes + 1 * D_OUT * D_IN * 4
    assert taps["output"].linalg_flops == planner.svdvals_flops(D_OUT, D_IN)


@pytest.mark.parametrize("k, q, batch", [(4, 1, 16), (8, 2, 4), (3, 0, 64)])
def test_randomized_plan_of_an_mlp_follows_subspace_iteration(k, q, batch):
    plan = plan_model(
        mlp("meta"),
        (D_IN,),
        method="randomized",
        k=k,
        power_iters=q,
        batch_size=batch,
        chunk_size=8,
    )
    taps = by_name(plan)
    n = min(max(1, batch // k), 8)  # images per pass
    calls = math.ceil(k / max(1, batch // n))  # vmap chunks of k directions
    assert (taps["(sketch)"].jvps, taps["(sketch)"].vjps) == (k, 0)
    assert taps["(sketch)"].flops == calls * 2 * FWD + k * FWD
    assert (taps["output"].jvps, taps["output"].vjps) == (q * k, (q + 1) * k)
    assert taps["output"].products + taps["(sketch)"].products == k * (2 * q + 2)
    expected = FWD + q * (calls * 2 * FWD + k * FWD) + (q + 1) * k * FWD
    assert taps["output"].flops == expected


def test_auto_keeps_derived_taps_exact_by_the_chain_rule():
    with torch.device("meta"):
        model = encoder(tiny_vit(), "cls")
    plan = plan_model(model, (3, 32, 32), k=8, power_iters=1, batch_size=64)  # 32 <= k(2q+2)
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


def test_linear_algebra_counts():
    assert planner.qr_flops(10, 4, with_q=False) == pytest.approx(2 * 10 * 16 - 2 * 64 / 3)
    assert planner.qr_flops(4, 10) == pytest.approx(2 * (2 * 10 * 16 - 2 * 64 / 3))
    assert planner.svdvals_flops(6, 6) == pytest.approx(4 * 216 - 4 * 216 / 3)


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
            real, torch.randn(1, 3, 32, 32), method=method, k=k, power_iters=q, batch_size=16
        )
    with torch.device("meta"):
        meta = encoder(make(), pooling)
    plan = plan_model(
        meta, (3, 32, 32), method=method, k=k, power_iters=q, batch_size=16, chunk_size=1
    )
    methods = {t.name: t.method for t in plan.taps if t.method not in ("setup", "sketch")}
    assert {name: "exact" if m == "chain" else m for name, m in methods.items()} == (
        spectra.methods
    )
    assert plan.flops_per_image == pytest.approx(counter.get_total_flops(), rel=1e-9)


def test_piecewise_units_equal_whole_passes():
    with torch.device("meta"):
        model = encoder(tiny_vit(), "cls")
    readout = planner.Readout(model)
    x = torch.zeros(1, 3, 32, 32, device="meta")
    with planner._jacobian_mode(model.model):
        units = planner.TapUnits(model, readout, x)
        assert units.pieces is not None
        for layer in model.layers:
            whole = planner.measure(lambda i, layer=layer: readout(i, (layer,))[layer], x)
            piece = units((layer,))
            assert (piece.fwd, piece.vjp, piece.jvp, piece.jvp_call) == (
                whole.fwd,
                whole.vjp,
                whole.jvp,
                whole.jvp_call,
            ), layer


# ------------------------------------------------------------------------ models from a config


def test_config_entries_are_built_on_meta_without_weights():
    entries = {
        "vit": {"source": "timm", "id": "vit_small_patch16_224.dino", "pretrained": True},
        "ckpt": {"source": "checkpoint", "id": "resnet18", "weights": "/nonexistent.safetensors"},
        "hub": {"source": "hub", "id": "dino_resnet50", "repo": "/nonexistent"},
    }
    for key, entry in entries.items():
        built, how = planner.build_on_meta(key, {**entry, "pooling": "cls"}, {})
        assert next(built.model.parameters()).device.type == "meta", key
    built, how = planner.build_on_meta("hub", {**entries["hub"], "pooling": "cls"}, {})
    assert built.layers == ["stage0", "stage1", "stage2", "stage3", "final"]  # no fc: no head
    assert how == planner.HUB_ARCHITECTURES["dino_resnet50"]


def test_the_wide_hub_resnet_has_doubled_widths():
    model = planner._WideResNet50().to("meta")
    widths = [getattr(model, f"layer{i}")[-1].conv3.out_channels for i in range(1, 5)]
    assert widths == [512, 1024, 2048, 4096]  # VICReg's resnet50x2: embedding 4096


def test_an_unknown_hub_entry_without_its_checkout_is_not_planned():
    config = {
        "jacobians": {
            "method": "auto",
            "k": 4,
            "power_iters": 1,
            "batch_size": 8,
            "chunk_size": 2,
            "layers": [],
            "probes": {"noise": {"n": 3}},
        },
        "models": {
            "odd": {"source": "hub", "id": "something_else", "repo": "/nonexistent"},
            "ctrl": {
                "source": "python",
                "id": "repdiag.binding.controls:random_features",
                "kwargs": {"image_size": 32},
                "pooling": "cls",
            },
        },
    }
    plan = planner.plan_config(config, rate=1e12)
    assert [m.key for m in plan.models] == ["ctrl"]
    assert "needs its local checkout" in plan.skipped["odd"]
    mlp_plan = plan.models[0]
    assert mlp_plan.images == 3
    assert plan.total_flops == pytest.approx(
        3 * (mlp_plan.flops_per_image + mlp_plan.linalg_per_image)
    )
    assert plan.seconds == pytest.approx(plan.total_flops / 1e12)
    text = planner.format_plan(plan)
    assert "not planned: odd:" in text and "excluded from the totals" in text
    assert "grand total: 1 models x 3 probe images" in text


def test_human_units():
    assert planner.human_flops(4.2e15) == "4.2 PFLOP"
    assert planner.human_bytes(1.5 * 2**30) == "1.5 GiB"
    assert planner.human_bytes(1000 * 2**20) == "0.977 GiB"
    assert planner.human_seconds(6480) == "1.80 h"
    assert planner.human_seconds(780) == "13.0 min"
    assert planner.human_seconds(3 * 86400) == "3.0 d"


def test_measured_rate_is_a_plausible_flop_rate():
    rate = planner.measure_rate(size=128, repeats=1, device="cpu")
    assert 1e6 < rate < 1e15
