"""Jacobian spectra engine: exact against autograd, closed forms, randomized accuracy, restarts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from repdiag.binding import jacobian as jac
from repdiag.binding.jacobian import jacobian_spectra, jer, run_chunked
from repdiag.core.errors import ConfigError, RegistryError

torch.set_num_threads(1)
F64 = torch.float64


# ---------------------------------------------------------------------------------- models


def small_mlp(d_in: int = 12, d_out: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 24), nn.Tanh(), nn.Linear(24, d_out)).to(F64)


class SmallCNN(nn.Module):
    """Two conv stages (eval-mode BatchNorm with non-trivial statistics, in-place ReLU) with taps."""

    layers = ("stage0", "stage1", "final")

    def __init__(self, width: int = 20) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv0 = nn.Conv2d(3, 6, 3, padding=1)
        self.norm0 = nn.BatchNorm2d(6)
        self.conv1 = nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, width)
        self.norm0.running_mean.uniform_(-0.5, 0.5)
        self.norm0.running_var.uniform_(0.5, 2.0)
        self.to(F64).eval()

    @property
    def model(self) -> nn.Module:
        return self

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        h0 = nn.functional.relu(self.norm0(self.conv0(x)), inplace=True)
        h1 = nn.functional.relu(self.conv1(h0))
        return {
            "stage0": h0.mean((2, 3)),
            "stage1": h1.mean((2, 3)),
            "final": self.fc(h1.flatten(1)),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_outputs(x)["final"]


class ViTTaps:
    """A small timm ViT seen through the encoders' taps (block00, block01, final)."""

    def __init__(self, width: int = 32, seed: int = 2) -> None:
        import timm

        from repdiag.encoders.taps import tap_plan

        torch.manual_seed(seed)
        self.model = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            img_size=16,
            patch_size=4,
            embed_dim=width,
            depth=2,
            num_heads=2,
            num_classes=0,
        ).to(F64)
        self.model.eval()
        self.plan = tap_plan(self.model, "cls")
        self.layers = self.plan.layers

    def layer_outputs(self, x: torch.Tensor, layers=None) -> dict[str, torch.Tensor]:
        from repdiag.encoders.taps import run_taps

        return run_taps(self.plan, x, layers)


def images(n: int, shape: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def autograd_spectra(fn, x: torch.Tensor) -> torch.Tensor:
    """Reference: torch.autograd.functional.jacobian per image, then torch.linalg.svdvals."""
    values = []
    for image in x:
        jacobian = torch.autograd.functional.jacobian(lambda inp: fn(inp[None])[0], image)
        values.append(torch.linalg.svdvals(jacobian.reshape(jacobian.shape[0], -1)))
    return torch.stack(values)


# ---------------------------------------------------------------------------------- JER


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], {"pr": 4.0, "pr2": 4.0, "entropy": 4.0}),
        ([5.0, 0.0, 0.0], {"pr": 1.0, "pr2": 1.0, "entropy": 1.0}),
        (
            [3.0, 1.0],
            {
                "pr": 16 / 10,
                "pr2": 100 / 82,
                "entropy": math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))),
            },
        ),
    ],
)
def test_jer_formulas_match_closed_forms(s, expected):
    for formula, value in expected.items():
        assert jer(torch.tensor([s], dtype=F64), formula).item() == pytest.approx(value, rel=1e-12)


def test_jer_uses_top_k_whatever_the_order_and_a_zero_spectrum_has_rank_zero():
    s = torch.tensor([[1.0, 4.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    top2 = jer(s, "pr", top_k=2)
    assert top2[0].item() == pytest.approx((4 + 3) ** 2 / (16 + 9))
    assert top2[1].item() == 0.0
    assert jer(np.array([2.0, 2.0]), "entropy").item() == pytest.approx(2.0)
    with pytest.raises(RegistryError, match="unknown JER formula 'nope'"):
        jer(s, "nope")


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
    spectra = jacobian_spectra(model, x, method="exact", batch_size=7)  # several chunks of rows
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
    exact = jacobian_spectra(layer, x, method="exact")["output"]
    randomized = jacobian_spectra(layer, x, method="randomized", k=8, power_iters=1)["output"]
    for row in range(3):
        torch.testing.assert_close(exact[row], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(randomized[row, :6], expected, rtol=1e-10, atol=1e-12)
    assert torch.all(randomized[:, 6:] == 0)  # only 6 directions exist: zero-padded to k


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_rank_r_bottleneck_has_at_most_r_nonzero_singular_values(method):
    torch.manual_seed(5)
    rank = 3
    model = nn.Sequential(nn.Linear(40, rank), nn.Tanh(), nn.Linear(rank, 16), nn.Tanh()).to(F64)
    s = jacobian_spectra(model, images(2, (40,)), method=method, k=8, power_iters=2)["output"]
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
    exact = jacobian_spectra(model, x, layers=layers, method="exact")
    randomized = jacobian_spectra(
        model, x, layers=layers, method="randomized", k=32, power_iters=5, seed=7
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
    spectra = jacobian_spectra(model, x, method="auto", k=4, power_iters=1)  # k (2q + 2) = 16
    assert spectra.methods == dict.fromkeys(model.layers, "randomized")
    assert all(spectra[name].shape == (2, 4) for name in model.layers)
    spectra = jacobian_spectra(model, x, method="auto", k=8, power_iters=1)  # 32 <= 32
    assert spectra.methods == dict.fromkeys(model.layers, "exact")
    assert all(spectra[name].shape == (2, 32) for name in model.layers)
    assert spectra.d_out == dict.fromkeys(model.layers, 32) and spectra.d_in == 768


def test_same_seed_same_output_other_seed_other_tail():
    model, x = ViTTaps(width=64), images(2, (3, 16, 16))
    kwargs = {"method": "randomized", "k": 6, "power_iters": 1}
    first = jacobian_spectra(model, x, seed=3, **kwargs)
    again = jacobian_spectra(model, x, seed=3, **kwargs)
    other = jacobian_spectra(model, x, seed=4, **kwargs)
    for name in first:
        assert torch.equal(first[name], again[name])
        assert not torch.equal(first[name], other[name])


@pytest.mark.parametrize("method", ["exact", "randomized"])
def test_layer_subsets_give_the_same_values_for_shared_layers(method):
    model, x = ViTTaps(width=40), images(3, (3, 16, 16))
    kwargs = {"method": method, "k": 6, "power_iters": 2, "seed": 1, "batch_size": 12}
    everything = jacobian_spectra(model, x, **kwargs)
    subset = jacobian_spectra(model, x, layers=["final", "block00"], **kwargs)
    assert list(subset) == ["block00", "final"]  # depth order
    for name in subset:
        torch.testing.assert_close(subset[name], everything[name], rtol=1e-12, atol=0)


def test_batch_size_bounds_work_not_results():
    model, x = SmallCNN(), images(5, (3, 8, 8))
    small = jacobian_spectra(model, x, method="randomized", k=4, power_iters=1, batch_size=1)
    large = jacobian_spectra(model, x, method="randomized", k=4, power_iters=1, batch_size=10_000)
    for name in small:
        torch.testing.assert_close(small[name], large[name], rtol=1e-10, atol=1e-12)


def test_model_mode_and_requires_grad_are_restored():
    model = small_mlp()
    model.train()
    model[0].weight.requires_grad_(False)
    jacobian_spectra(model, images(2, (12,)), method="exact")
    assert model.training
    assert not model[0].weight.requires_grad and model[2].weight.requires_grad


def test_images_follow_the_model_dtype_and_bad_arguments_are_errors():
    model = small_mlp()
    s = jacobian_spectra(model, images(2, (12,)).float().numpy(), method="exact")
    assert s["output"].dtype == F64
    with pytest.raises(ConfigError, match=r"unknown layers \['block09'\]"):
        jacobian_spectra(ViTTaps(), images(1, (3, 16, 16)), layers=["block09"])
    with pytest.raises(ConfigError, match="unknown Jacobian method 'svd'"):
        jacobian_spectra(model, images(1, (12,)), method="svd")
    with pytest.raises(ConfigError, match="non-empty batch"):
        jacobian_spectra(model, torch.zeros(0, 12, dtype=F64))
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        jacobian_spectra(42, images(1, (12,)))


def test_patch_embedding_convolutions_run_as_the_same_matmul():
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 18, 17, generator=generator, dtype=F64)  # sizes not multiples of 4
    patchify = nn.Conv2d(3, 5, 4, stride=4).to(F64)
    no_bias = nn.Conv2d(3, 5, (4, 2), stride=(4, 2), bias=False).to(F64)
    padded = nn.Conv2d(3, 5, 4, stride=4, padding=1).to(F64)
    expected = [conv(x) for conv in (patchify, no_bias, padded)]
    calls = []
    original = jac._JacobianRewrites._as_matmul
    with jac._JacobianRewrites():
        jac._JacobianRewrites._as_matmul = staticmethod(lambda *a: calls.append(1) or original(*a))
        try:
            got = [conv(x) for conv in (patchify, no_bias, padded)]
        finally:
            jac._JacobianRewrites._as_matmul = staticmethod(original)
    assert calls == [1, 1]  # the padded convolution is left to conv2d
    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------- restarts


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_killed_run_resumes_with_the_missing_chunks_only(tmp_path, monkeypatch):
    model, x = SmallCNN(), images(5, (3, 8, 8))
    kwargs = {"chunk_size": 2, "method": "auto", "k": 4, "power_iters": 1, "seed": 2}
    uninterrupted = run_chunked(model, x, tmp_path / "reference", **kwargs)

    real, calls = jac.jacobian_spectra, []

    def killed_after_two_chunks(*args, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        calls.append(len(args[1]))
        return real(*args, **kw)

    monkeypatch.setattr(jac, "jacobian_spectra", killed_after_two_chunks)
    with pytest.raises(KeyboardInterrupt):
        run_chunked(model, x, tmp_path / "run", **kwargs)
    assert _listing(tmp_path / "run") == ["chunk_0000.npz", "chunk_0001.npz"]  # no temporaries

    calls.clear()
    monkeypatch.setattr(
        jac, "jacobian_spectra", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw)
    )
    resumed = run_chunked(model, x, tmp_path / "run", **kwargs)
    assert calls == [1]  # only the last chunk (1 image) was computed
    assert (
        resumed.methods
        == uninterrupted.methods
        == {"stage0": "exact", "stage1": "exact", "final": "randomized"}
    )
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name])


def test_an_unreadable_cached_chunk_is_recomputed(tmp_path):
    model, x = small_mlp(), images(3, (12,))
    first = run_chunked(model, x, tmp_path, chunk_size=2, method="exact")
    (tmp_path / "chunk_0001.npz").write_bytes(b"not a zip file")
    again = run_chunked(model, x, tmp_path, chunk_size=2, method="exact")
    assert torch.equal(first["output"], again["output"])


def test_cache_key_changes_with_settings_weights_and_images():
    model, x = small_mlp(), images(2, (12,))
    weights, pixels = jac.model_fingerprint(model), jac.tensor_digest(x)
    key = jac.cache_key({"k": 4}, weights, pixels)
    assert key == jac.cache_key(
        {"k": 4}, jac.model_fingerprint(small_mlp()), jac.tensor_digest(x.clone())
    )
    assert key != jac.cache_key({"k": 5}, weights, pixels)
    assert key != jac.cache_key({"k": 4}, jac.model_fingerprint(small_mlp(seed=1)), pixels)
    assert key != jac.cache_key({"k": 4}, weights, jac.tensor_digest(x + 1e-9))


# ------------------------------------------------------------- registry ViT: shortcuts


def registry_vit(**kwargs):
    """A timm ViT through the encoder registry (class-token taps, derived final and head)."""
    from repdiag.encoders import build_encoder

    torch.manual_seed(4)
    entry = {
        "source": "timm",
        "id": "vit_tiny_patch16_224",
        "family": "other",
        "kwargs": {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 2, "num_heads": 2}
        | kwargs,
    }
    encoder = build_encoder("vit", entry)
    encoder.model.double()
    return encoder


def plain_readout(encoder, name: str):
    """Tap ``name`` of a registry ViT computed the plain way: full blocks, the model's own head."""
    model = encoder.model
    if name in ("final", "head"):
        return lambda inp: encoder.plan.run(inp, True)[name == "head"]
    depth = int(name[5:]) + 1

    def block_cls(inp):
        h = model.norm_pre(model._pos_embed(model.patch_embed(inp)))
        for block in model.blocks[:depth]:
            h = block(h)
        return h[:, 0]

    return block_cls


def test_registry_vit_exact_spectra_match_autograd_through_the_shortcuts(monkeypatch):
    """Class-token-only last blocks and chain-rule final/head give the autograd spectra."""
    from repdiag.encoders import taps

    encoder = registry_vit(num_classes=5)
    assert {tap: parent for tap, (parent, _) in encoder.derived_taps.items()} == {
        "final": "block01",
        "head": "final",
    }
    calls = {"cls_token_block": 0, "_row_jacobians": 0}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(taps, "cls_token_block")
    counted(jac, "_row_jacobians")
    x = images(2, (3, 16, 16))
    spectra = jacobian_spectra(encoder, x, method="exact")
    assert calls["cls_token_block"] >= 2 and calls["_row_jacobians"] >= 2  # shortcuts taken
    for name in encoder.layers:
        ref = autograd_spectra(plain_readout(encoder, name), x)
        relative = (spectra[name] - ref).abs().max() / ref.max()
        assert relative < 1e-10, (name, relative.item())


def test_derived_taps_alone_or_with_their_parent_give_the_same_spectra():
    encoder = registry_vit(num_classes=5)
    x = images(2, (3, 16, 16))
    together = jacobian_spectra(encoder, x, method="exact")
    for name in ("final", "head"):
        alone = jacobian_spectra(encoder, x, layers=[name], method="exact")
        torch.testing.assert_close(alone[name], together[name], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- registry ResNet: derived chain


def registry_resnet_with_head():
    """A zoo-style timm ResNet + wide projection head: stage3 -> final -> head by the chain rule."""
    import timm

    from repdiag.encoders.heads import WithHead
    from repdiag.encoders.taps import run_taps, tap_plan

    torch.manual_seed(5)
    backbone = timm.create_model(
        "resnet10t", pretrained=False, num_classes=0, channels=(4, 8, 8, 6)
    )
    head = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 40))
    model = WithHead(backbone, head).double().eval()
    plan = tap_plan(model, "mean")

    class Encoder:
        layers = plan.layers
        derived_taps = plan.derived

        def __init__(self):
            self.model = model

        def layer_outputs(self, inp, layers=None):
            return run_taps(plan, inp, layers)

    return Encoder(), plan


def test_resnet_chain_gives_the_autograd_spectra_and_auto_makes_the_wide_head_exact():
    encoder, plan = registry_resnet_with_head()
    assert {tap: parent for tap, (parent, _) in plan.derived.items()} == {
        "final": "stage3",
        "head": "final",
    }
    x = images(2, (3, 16, 16))
    # head is 40 wide > k (2q + 2) = 2 * 4 = 8, yet derived from an exact 6-wide final: exact
    spectra = jacobian_spectra(encoder, x, method="auto", k=2, power_iters=1)
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


# ------------------------------------------------------------- global pooling as a mean


class ChannelsLastPool(nn.Module):
    """ConvNeXt's pattern: a per-pixel linear layer on (N, H, W, C) leaves the feature map
    channels-last in memory, then timm's/torchvision's global pooling ``adaptive_avg_pool2d``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.mix = nn.Linear(4, 5)
        self.to(F64)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mix(self.conv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)


@pytest.fixture
def no_vmap_fallback():
    """Ops without a batching rule raise instead of looping over the batch one at a time."""
    enabled = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(enabled)


def test_global_average_pooling_runs_as_a_mean_that_has_batching_rules(
    no_vmap_fallback, monkeypatch
):
    model, x = ChannelsLastPool(), images(2, (3, 6, 6))
    assert model.features(x).is_contiguous(memory_format=torch.channels_last)
    ref = autograd_spectra(model, x)
    for method in ("exact", "randomized"):  # randomized: forward-mode products too
        spectra = jacobian_spectra(model, x, method=method, k=5, power_iters=2)
        relative = (spectra["output"][:, :5] - ref[:, :5]).abs().max() / ref.max()
        assert relative < 1e-10, (method, relative.item())
    monkeypatch.setattr(jac._JacobianRewrites, "global_pool", False)
    with pytest.raises(RuntimeError, match=r"as_strided_ hit the vmap fallback"):  # the baseline
        jacobian_spectra(model, x, method="randomized", k=5, power_iters=2)


def test_only_pooling_to_one_pixel_becomes_a_mean():
    h = images(2, (3, 4, 6))
    with jac._JacobianRewrites():
        pooled = nn.functional.adaptive_avg_pool2d(h, (1, 1))
        halves = nn.functional.adaptive_avg_pool2d(h, (1, 2))  # left as adaptive pooling
        module = nn.AdaptiveAvgPool2d(1)(h)
    torch.testing.assert_close(pooled, h.mean((2, 3), keepdim=True), rtol=0, atol=0)
    torch.testing.assert_close(module, pooled, rtol=0, atol=0)
    expected = torch.stack([h[..., :3].mean((2, 3)), h[..., 3:].mean((2, 3))], dim=-1)[:, :, None]
    torch.testing.assert_close(halves, expected, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------- precision


def test_bf16_gives_the_singular_values_of_the_bfloat16_weight_of_a_linear_map():
    """Under bfloat16 autocast y = W x has J = bf16(W): a one-hot cotangent picks a row of
    bf16(W) exactly, so the engine returns svdvals(bf16(W)); fp32 returns svdvals(W)."""
    torch.manual_seed(9)
    model = nn.Linear(12, 10, bias=False)
    x = torch.randn(3, 12)
    weight = model.weight.detach()
    full = jacobian_spectra(model, x, method="exact")
    mixed = jacobian_spectra(model, x, method="exact", precision="bf16")
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
    default = jacobian_spectra(taps, x, method="auto", k=4, power_iters=1)
    runs = {
        precision: jacobian_spectra(taps, x, method="auto", k=4, power_iters=1, precision=precision)
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
        jacobian_spectra(taps, x, precision="fp16")


def test_the_attention_decomposition_is_scaled_dot_product_attention():
    generator = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=generator, dtype=F64) for _ in range(3))
    boolean = torch.rand(5, 5, generator=generator) > 0.3
    boolean[:, 0] = True  # every query sees a key
    additive = torch.randn(5, 5, generator=generator, dtype=F64)
    for kwargs in (
        {},
        {"scale": 0.3},
        {"is_causal": True},
        {"attn_mask": boolean},
        {"attn_mask": additive},
    ):
        want = nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        torch.testing.assert_close(jac._attention(q, k, v, **kwargs), want, rtol=1e-12, atol=1e-12)


def test_the_eval_batch_norm_decomposition_is_batch_norm():
    generator = torch.Generator().manual_seed(11)
    for shape in ((4, 3), (2, 3, 5, 4)):
        x = torch.randn(*shape, generator=generator, dtype=F64)
        mean, var = torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5
        weight, bias = torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)
        for affine in ({"weight": weight, "bias": bias}, {}):
            want = nn.functional.batch_norm(x, mean, var, training=False, eps=1e-3, **affine)
            call = {"running_mean": mean, "running_var": var, **affine}
            torch.testing.assert_close(jac._batch_norm(x, call, 1e-3), want, rtol=1e-12, atol=1e-12)


def test_bf16_spectra_of_a_batch_norm_cnn_match_autograd_under_autocast():
    """The engine's bfloat16 path (vmapped products, batch norm and the chain-rule head through
    their decompositions) against per-image autograd Jacobians of the model under autocast."""
    encoder, _ = registry_resnet_with_head()
    encoder.model.float()
    x = images(2, (3, 16, 16)).float()
    full = jacobian_spectra(encoder, x, method="auto", k=2, power_iters=1)
    mixed = jacobian_spectra(encoder, x, method="auto", k=2, power_iters=1, precision="bf16")
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
