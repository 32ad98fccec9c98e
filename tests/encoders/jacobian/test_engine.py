"""The Jacobian spectra engine (repdiag.encoders.jacobian.engine): exact against autograd, closed
forms, randomized accuracy, method choice, the chain-rule shortcuts of registry encoders (final
taps and projection heads, repdiag.encoders.heads, as derived taps), and precision."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.encoders.jacobian import engine as eng
from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer
from tests.encoders.jacobian.models import (
    F64,
    SmallCNN,
    ViTTaps,
    autograd_spectra,
    engine,
    images,
    plain_readout,
    registry_resnet_with_head,
    registry_vit,
    small_mlp,
)

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------- exact


@pytest.mark.parametrize("model_name", ["mlp", "cnn", "vit"])
def test_exact_matches_autograd_jacobian_svd_in_float64(model_name):
    if model_name == "mlp":
        model, x = small_mlp(), images(3, (12,))
        refs = {"output": autograd_spectra(model, x)}
    else:
        model = SmallCNN() if model_name == "cnn" else ViTTaps()
        x = images(2, (3, 8, 8) if model_name == "cnn" else (3, 16, 16))
        refs = {
            name: autograd_spectra(lambda inp, name=name: model.layer_outputs(inp, [name])[name], x)
            for name in model.layers
        }
    spectra = jacobian_spectra(
        model, x, **engine(method="exact", batch_size=7)
    )  # several chunks of rows
    assert list(spectra) == list(refs)
    for name, ref in refs.items():
        assert spectra[name].dtype == F64 and spectra[name].shape == ref.shape
        assert spectra.methods[name] == "exact"
        relative = (spectra[name] - ref).abs().max() / ref.max()
        assert relative < 1e-4, (name, relative.item())
        assert torch.all(spectra[name][:, :-1] >= spectra[name][:, 1:])  # sorted descending


def test_linear_map_gives_the_singular_values_of_w():
    torch.manual_seed(4)
    layer = nn.Linear(30, 6, bias=True).to(F64)
    expected = torch.linalg.svdvals(layer.weight.detach())
    x = images(3, (30,))
    exact = jacobian_spectra(layer, x, **engine(method="exact"))["output"]
    randomized = jacobian_spectra(layer, x, **engine(method="randomized", k=8, power_iters=1))[
        "output"
    ]
    for row in range(3):
        torch.testing.assert_close(exact[row], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(randomized[row, :6], expected, rtol=1e-10, atol=1e-12)
    assert torch.all(randomized[:, 6:] == 0)  # only 6 directions exist: zero-padded to k


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_rank_r_bottleneck_has_at_most_r_nonzero_singular_values(method):
    torch.manual_seed(5)
    rank = 3
    model = nn.Sequential(nn.Linear(40, rank), nn.Tanh(), nn.Linear(rank, 16), nn.Tanh()).to(F64)
    s = jacobian_spectra(model, images(2, (40,)), **engine(method=method, k=8, power_iters=2))[
        "output"
    ]
    assert torch.all(s[:, rank - 1] > 1e-3 * s[:, 0])
    assert torch.all(s[:, rank:] < 1e-7 * s[:, :1])


# ---------------------------------------------------------------------------------- randomized


@pytest.mark.parametrize("model_name", ["mlp", "cnn", "vit"])
def test_randomized_k32_q5_matches_the_exact_top_values(model_name):
    """Measured (float64, seed 7, d_out = 64): the top 16 agree to 1.3e-7 (MLP), 1.1e-6 (CNN) and
    7.7e-13 (ViT); over all 32 the largest errors, at ranks near k, are 5.3%, 6.7% and 11.3% (median
    < 1e-6); JER is within 0.18%, 0.28% and 0.16% of the exact top-32 JER."""
    if model_name == "mlp":
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(96, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 64)
        ).to(F64)
        x, layers = images(3, (96,)), None
    elif model_name == "cnn":
        model, x, layers = SmallCNN(width=64), images(3, (3, 8, 8)), ["final"]
    else:
        model, x, layers = ViTTaps(width=64), images(2, (3, 16, 16)), None
    exact = jacobian_spectra(model, x, layers=layers, **engine(method="exact"))
    randomized = jacobian_spectra(
        model, x, layers=layers, **engine(method="randomized", k=32, power_iters=5, seed=7)
    )
    for name in exact:
        assert randomized.methods[name] == "randomized" and randomized[name].shape[1] == 32
        assert exact[name].shape[1] == 64  # so the range finder sees only half of the spectrum
        top = exact[name][:, :32]
        relative = (randomized[name] - top).abs() / top
        assert relative[:, :16].max() < 0.01
        assert relative.max() < 0.25  # the values near k are estimated less well
        jer_error = (jer(randomized[name]) - jer(top)).abs() / jer(top)
        assert jer_error.max() < 0.02


def test_auto_is_exact_for_narrow_readouts_and_randomized_for_wide_ones():
    model = ViTTaps(width=32)
    x = images(2, (3, 16, 16))
    spectra = jacobian_spectra(
        model, x, **engine(method="auto", k=4, power_iters=1)
    )  # k (2q + 2) = 16
    assert spectra.methods == dict.fromkeys(model.layers, "randomized")
    assert all(spectra[name].shape == (2, 4) for name in model.layers)
    spectra = jacobian_spectra(model, x, **engine(method="auto", k=8, power_iters=1))  # 32 <= 32
    assert spectra.methods == dict.fromkeys(model.layers, "exact")
    assert all(spectra[name].shape == (2, 32) for name in model.layers)
    assert spectra.d_out == dict.fromkeys(model.layers, 32) and spectra.d_in == 768


def test_same_seed_same_output_other_seed_other_tail():
    model, x = ViTTaps(width=64), images(2, (3, 16, 16))
    kwargs = {"method": "randomized", "k": 6, "power_iters": 1}
    first = jacobian_spectra(model, x, **engine(seed=3, **kwargs))
    again = jacobian_spectra(model, x, **engine(seed=3, **kwargs))
    other = jacobian_spectra(model, x, **engine(seed=4, **kwargs))
    for name in first:
        assert torch.equal(first[name], again[name])
        assert not torch.equal(first[name], other[name])


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_layer_subsets_give_the_same_values_for_shared_layers(method):
    model, x = ViTTaps(width=40), images(3, (3, 16, 16))
    kwargs = {"method": method, "k": 6, "power_iters": 2, "seed": 1, "batch_size": 12}
    everything = jacobian_spectra(model, x, **engine(**kwargs))
    subset = jacobian_spectra(model, x, layers=["final", "block00"], **engine(**kwargs))
    assert list(subset) == ["block00", "final"]  # depth order
    for name in subset:
        torch.testing.assert_close(subset[name], everything[name], rtol=1e-12, atol=0)


def test_batch_size_bounds_work_not_results():
    model, x = SmallCNN(), images(5, (3, 8, 8))
    small = jacobian_spectra(
        model, x, **engine(method="randomized", k=4, power_iters=1, batch_size=1)
    )
    large = jacobian_spectra(
        model, x, **engine(method="randomized", k=4, power_iters=1, batch_size=10_000)
    )
    for name in small:
        torch.testing.assert_close(small[name], large[name], rtol=1e-10, atol=1e-12)


def test_model_mode_and_requires_grad_are_restored():
    model = small_mlp()
    model.train()
    model[0].weight.requires_grad_(False)
    jacobian_spectra(model, images(2, (12,)), **engine(method="exact"))
    assert model.training
    assert not model[0].weight.requires_grad and model[2].weight.requires_grad


def test_images_follow_the_model_dtype_and_bad_arguments_are_errors():
    model = small_mlp()
    s = jacobian_spectra(model, images(2, (12,)).float().numpy(), **engine(method="exact"))
    assert s["output"].dtype == F64
    with pytest.raises(ConfigError, match=r"unknown layers \['block09'\]"):
        jacobian_spectra(ViTTaps(), images(1, (3, 16, 16)), layers=["block09"], **engine())
    with pytest.raises(ConfigError, match="unknown Jacobian method 'svd'"):
        jacobian_spectra(model, images(1, (12,)), **engine(method="svd"))
    with pytest.raises(ConfigError, match="non-empty batch"):
        jacobian_spectra(model, torch.zeros(0, 12, dtype=F64), **engine())
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        jacobian_spectra(42, images(1, (12,)), **engine())


# ------------------------------------------------------------- registry ViT: shortcuts


def test_registry_vit_exact_spectra_match_autograd_through_the_shortcuts(monkeypatch):
    """Class-token-only last blocks and chain-rule final/head give the autograd spectra."""
    from repdiag.encoders import vit_shortcuts

    encoder = registry_vit(num_classes=5)
    assert {tap: parent for tap, (parent, _) in encoder.derived_taps.items()} == {
        "final": "block01",
        "head": "final",
    }
    calls = {"cls_token_block": 0, "row_jacobians": 0}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(vit_shortcuts, "cls_token_block")
    counted(eng, "row_jacobians")
    x = images(2, (3, 16, 16))
    spectra = jacobian_spectra(encoder, x, **engine(method="exact"))
    assert calls["cls_token_block"] >= 2 and calls["row_jacobians"] >= 2  # shortcuts taken
    for name in encoder.layers:
        ref = autograd_spectra(plain_readout(encoder, name), x)
        relative = (spectra[name] - ref).abs().max() / ref.max()
        assert relative < 1e-10, (name, relative.item())


def test_derived_taps_alone_or_with_their_parent_give_the_same_spectra():
    encoder = registry_vit(num_classes=5)
    x = images(2, (3, 16, 16))
    together = jacobian_spectra(encoder, x, **engine(method="exact"))
    for name in ("final", "head"):
        alone = jacobian_spectra(encoder, x, layers=[name], **engine(method="exact"))
        torch.testing.assert_close(alone[name], together[name], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- registry ResNet: derived chain


def test_resnet_chain_gives_the_autograd_spectra_and_auto_makes_the_wide_head_exact():
    encoder, plan = registry_resnet_with_head()
    assert {tap: parent for tap, (parent, _) in plan.derived.items()} == {
        "final": "stage3",
        "head": "final",
    }
    x = images(2, (3, 16, 16))
    # head is 40 wide > k (2q + 2) = 2 * 4 = 8, yet derived from an exact 6-wide final: exact
    spectra = jacobian_spectra(encoder, x, **engine(method="auto", k=2, power_iters=1))
    assert spectra.methods["final"] == spectra.methods["head"] == "exact"
    plain = {
        "final": encoder.model.embedding,
        "head": encoder.model,
    }
    for name, fn in plain.items():
        ref = autograd_spectra(fn, x)
        assert spectra[name].shape == ref.shape  # min(40, 768) values, the rank-6 tail zero
        relative = (spectra[name] - ref).abs().max() / ref.max()
        assert relative < 1e-10, (name, relative.item())
    assert torch.all(spectra["head"][:, 6:] == 0)
    torch.testing.assert_close(spectra["final"], spectra["stage3"], rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------- precision


def test_bf16_gives_the_singular_values_of_the_bfloat16_weight_of_a_linear_map():
    """Under bfloat16 autocast y = W x has J = bf16(W): a one-hot cotangent picks a row of
    bf16(W) exactly, so the engine returns svdvals(bf16(W)); fp32 returns svdvals(W)."""
    torch.manual_seed(9)
    model = nn.Linear(12, 10, bias=False)
    x = torch.randn(3, 12)
    weight = model.weight.detach()
    full = jacobian_spectra(model, x, **engine(method="exact"))
    mixed = jacobian_spectra(model, x, **engine(method="exact", precision="bf16"))
    want_full = torch.linalg.svdvals(weight).expand(3, -1)
    want_mixed = torch.linalg.svdvals(weight.bfloat16().float()).expand(3, -1)
    torch.testing.assert_close(full["output"], want_full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(mixed["output"], want_mixed, rtol=1e-6, atol=1e-7)
    assert mixed["output"].dtype == torch.float32
    assert (mixed["output"] - full["output"]).abs().max() > 1e-4  # bf16 rounding is visible
    assert mixed.numerics["precision"] == mixed.numerics["precision_effective"] == "bf16"


def test_fp32_is_the_default_and_tf32_on_cpu_is_fp32_bit_for_bit():
    taps, x = registry_vit(num_classes=5), images(2, (3, 16, 16)).float()
    taps.model.float()
    default = jacobian_spectra(taps, x, **engine(method="auto", k=4, power_iters=1))
    runs = {
        precision: jacobian_spectra(
            taps, x, **engine(method="auto", k=4, power_iters=1, precision=precision)
        )
        for precision in ("fp32", "tf32", "bf16")
    }
    for name in default:
        assert torch.equal(runs["fp32"][name], default[name])
        assert torch.equal(runs["tf32"][name], default[name])
        # bf16 (the derived final and head too): close to fp32, not equal
        got, want = jer(runs["bf16"][name]), jer(default[name])
        assert not torch.equal(runs["bf16"][name], default[name])
        assert ((got - want).abs() / want).max() < 0.05, name
    assert default.numerics["precision_effective"] == "fp32"
    assert runs["tf32"].numerics["precision"] == "tf32"
    assert runs["tf32"].numerics["precision_effective"] == "fp32"  # no TF32 on a CPU
    with pytest.raises(ConfigError, match="unknown precision 'fp16'"):
        jacobian_spectra(taps, x, **engine(precision="fp16"))


def test_bf16_spectra_of_a_batch_norm_cnn_match_autograd_under_autocast():
    """The engine's bfloat16 path (vmapped products, batch norm and the chain-rule head through
    their decompositions) against per-image autograd Jacobians of the model under autocast."""
    encoder, _ = registry_resnet_with_head()
    encoder.model.float()
    x = images(2, (3, 16, 16)).float()
    full = jacobian_spectra(encoder, x, **engine(method="auto", k=2, power_iters=1))
    mixed = jacobian_spectra(
        encoder, x, **engine(method="auto", k=2, power_iters=1, precision="bf16")
    )
    assert mixed.methods == full.methods and mixed.methods["head"] == "exact"

    def under_autocast(fn):
        def run(inp):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(inp).float()

        return run

    for name, fn in {"final": encoder.model.embedding, "head": encoder.model}.items():
        ref = autograd_spectra(under_autocast(fn), x)
        assert not torch.equal(mixed[name], full[name])  # bfloat16 ran
        relative = (mixed[name] - ref).abs().max() / ref.max()
        assert relative < 5e-3, (name, relative.item())  # rounding of the batch norms only
