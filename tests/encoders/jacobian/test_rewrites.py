"""Ops the engine runs in other forms (repdiag.encoders.jacobian.rewrites): patch embeddings as
matmuls, global average pooling as a mean, attention and eval-mode batch norm decomposed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repdiag.encoders.jacobian import rewrites
from repdiag.encoders.jacobian.engine import jacobian_spectra
from tests.encoders.jacobian.models import F64, autograd_spectra, engine, images

torch.set_num_threads(1)


def test_patch_embedding_convolutions_run_as_the_same_matmul():
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 18, 17, generator=generator, dtype=F64)  # sizes not multiples of 4
    patchify = nn.Conv2d(3, 5, 4, stride=4).to(F64)
    no_bias = nn.Conv2d(3, 5, (4, 2), stride=(4, 2), bias=False).to(F64)
    padded = nn.Conv2d(3, 5, 4, stride=4, padding=1).to(F64)
    expected = [conv(x) for conv in (patchify, no_bias, padded)]
    calls = []
    original = rewrites._JacobianRewrites._as_matmul
    with rewrites._JacobianRewrites():
        rewrites._JacobianRewrites._as_matmul = staticmethod(
            lambda *a: calls.append(1) or original(*a)
        )
        try:
            got = [conv(x) for conv in (patchify, no_bias, padded)]
        finally:
            rewrites._JacobianRewrites._as_matmul = staticmethod(original)
    assert calls == [1, 1]  # the padded convolution is left to conv2d
    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


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
        spectra = jacobian_spectra(model, x, **engine(method=method, k=5, power_iters=2))
        relative = (spectra["output"][:, :5] - ref[:, :5]).abs().max() / ref.max()
        assert relative < 1e-10, (method, relative.item())
    monkeypatch.setattr(rewrites._JacobianRewrites, "global_pool", False)
    with pytest.raises(RuntimeError, match=r"as_strided_ hit the vmap fallback"):  # the baseline
        jacobian_spectra(model, x, **engine(method="randomized", k=5, power_iters=2))


def test_only_pooling_to_one_pixel_becomes_a_mean():
    h = images(2, (3, 4, 6))
    with rewrites._JacobianRewrites():
        pooled = nn.functional.adaptive_avg_pool2d(h, (1, 1))
        halves = nn.functional.adaptive_avg_pool2d(h, (1, 2))  # left as adaptive pooling
        module = nn.AdaptiveAvgPool2d(1)(h)
    torch.testing.assert_close(pooled, h.mean((2, 3), keepdim=True), rtol=0, atol=0)
    torch.testing.assert_close(module, pooled, rtol=0, atol=0)
    expected = torch.stack([h[..., :3].mean((2, 3)), h[..., 3:].mean((2, 3))], dim=-1)[:, :, None]
    torch.testing.assert_close(halves, expected, rtol=1e-12, atol=1e-14)


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
        torch.testing.assert_close(
            rewrites._attention(q, k, v, **kwargs), want, rtol=1e-12, atol=1e-12
        )


def test_the_eval_batch_norm_decomposition_is_batch_norm():
    generator = torch.Generator().manual_seed(11)
    for shape in ((4, 3), (2, 3, 5, 4)):
        x = torch.randn(*shape, generator=generator, dtype=F64)
        mean, var = torch.randn(3, dtype=F64), torch.rand(3, dtype=F64) + 0.5
        weight, bias = torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)
        for affine in ({"weight": weight, "bias": bias}, {}):
            want = nn.functional.batch_norm(x, mean, var, training=False, eps=1e-3, **affine)
            call = {"running_mean": mean, "running_var": var, **affine}
            torch.testing.assert_close(
                rewrites._batch_norm(x, call, 1e-3), want, rtol=1e-12, atol=1e-12
            )


def test_the_layer_norm_decomposition_is_layer_norm():
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(2, 5, 4, 6, generator=generator, dtype=F64)
    weight, bias = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    for shape, affine in (((6,), {}), ((4, 6), {"weight": weight, "bias": bias})):
        want = nn.functional.layer_norm(x, shape, eps=1e-6, **affine)
        got = rewrites._layer_norm(x, shape, eps=1e-6, **affine)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


class _ConvNeXtStart(nn.Module):
    """A depthwise convolution, then layer norm over channels (timm's LayerNorm2d): the pair
    whose vmapped bfloat16 backward failed on the CPU before layer norm was decomposed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return y.flatten(1)


def test_bf16_runs_a_depthwise_convolution_into_layer_norm():
    model, x = _ConvNeXtStart().eval(), images(2, (4, 5, 5)).float()
    settings = engine(method="randomized", k=6, power_iters=2, seed=0)
    fp32 = jacobian_spectra(model, x, **{**settings, "precision": "fp32"})
    bf16 = jacobian_spectra(model, x, **{**settings, "precision": "bf16"})
    torch.testing.assert_close(bf16["output"], fp32["output"], rtol=0.05, atol=0.05)
    assert not torch.equal(bf16["output"], fp32["output"])  # bfloat16 did run
