"""The stochastic PR_2 estimate against closed forms and the exact engine, and its gradient
against finite differences (repdiag.encoders.jer_estimator)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repdiag.encoders.jacobian.engine import jacobian_spectra
from repdiag.encoders.jacobian.jer import jer
from repdiag.encoders.jer_estimator import estimate_pr2, probe_norms
from tests.encoders.jacobian.models import engine

N_PROBES = 4096  # relative error of each probe mean ~ sqrt(2 / (PR_2 m)): about 1-2 % here


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5)).double()


def _cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 7),
    ).double()


def test_a_linear_map_gives_the_closed_form() -> None:
    s = torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    q_out, _ = torch.linalg.qr(torch.randn(5, 4, dtype=torch.float64))
    q_in, _ = torch.linalg.qr(torch.randn(6, 4, dtype=torch.float64))
    matrix = q_out @ torch.diag(s) @ q_in.T  # 5 x 6, singular values s
    x = torch.randn(3, 6, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    forward, backward = probe_norms(lambda z: z @ matrix.T, x, N_PROBES, gen)
    assert forward.mean().item() == pytest.approx(float((s**2).sum()), rel=0.03)
    assert backward.mean().item() == pytest.approx(float((s**4).sum()), rel=0.05)
    closed = float((s**2).sum() ** 2 / (s**4).sum())  # 2.58...
    estimate = estimate_pr2(lambda z: z @ matrix.T, x, N_PROBES, gen)
    torch.testing.assert_close(
        estimate, torch.full((3,), closed, dtype=torch.float64), rtol=0.06, atol=0
    )


@pytest.mark.parametrize("make, shape", [(_mlp, (4, 6)), (_cnn, (3, 3, 8, 8))], ids=["mlp", "cnn"])
def test_the_estimate_agrees_with_the_exact_engine(make, shape) -> None:
    """Per image within 6 % of the engine's exact ``pr2``, at 4096 probes."""
    model = make()
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact = jer(jacobian_spectra(model, x, **engine(method="exact"))["output"], "pr2")
    estimate = estimate_pr2(model, x, N_PROBES, torch.Generator().manual_seed(3))
    assert bool((exact > 1.5).all())  # not a degenerate rank-1 case
    torch.testing.assert_close(estimate, exact, rtol=0.06, atol=0)


def test_each_image_gets_its_own_jacobian() -> None:
    """f(x) = 2 x where x's first coordinate is positive, else 0: image 0 (negative) has J = 0,
    rank 0; image 1 has J = 2 I, all six singular values equal, PR_2 = 6."""

    def gate(z: torch.Tensor) -> torch.Tensor:
        return 2 * z * (z[:, :1] > 0)

    x = torch.randn(2, 6, dtype=torch.float64)
    x[0, 0], x[1, 0] = -1.0, 1.0
    forward, _ = probe_norms(gate, x, N_PROBES, torch.Generator().manual_seed(4))
    assert bool((forward[0] == 0).all())
    assert forward[1].mean().item() == pytest.approx(4 * 6, rel=0.03)  # ||2 v||^2, E ||v||^2 = 6
    estimate = estimate_pr2(gate, x, N_PROBES, torch.Generator().manual_seed(5))
    assert estimate[0].item() == 0.0 and estimate[1].item() == pytest.approx(6, rel=0.03)


def test_a_constant_map_has_rank_zero() -> None:
    x = torch.randn(2, 6, dtype=torch.float64)
    assert estimate_pr2(lambda z: 0 * z + 1, x, 3).tolist() == [0.0, 0.0]


def test_the_gradient_matches_finite_differences() -> None:
    """R(theta) = mean estimate with the probes drawn from one seed: a smooth function of the
    weights, whose autograd gradient (create_graph) matches central differences in float64."""
    model = _mlp()
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    weight = model[0].weight

    def regulariser() -> torch.Tensor:
        gen = torch.Generator().manual_seed(7)
        return estimate_pr2(model, x, 3, gen, create_graph=True).mean()

    (grad,) = torch.autograd.grad(regulariser(), weight)
    direction = torch.randn(
        weight.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(8)
    )
    eps = 1e-6
    with torch.no_grad():
        weight += eps * direction
    plus = regulariser().item()
    with torch.no_grad():
        weight -= 2 * eps * direction
    minus = regulariser().item()
    assert float((grad * direction).sum()) == pytest.approx((plus - minus) / (2 * eps), rel=1e-5)
    assert float(grad.abs().sum()) > 0


def test_a_vit_with_fused_attention_is_differentiable_twice() -> None:
    """timm's ViT attention runs a fused SDPA kernel, which has no double backward; the estimator
    takes the math kernel, so the regulariser trains a ViT zoo run (the workflow tests' jer_up)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=16,
        patch_size=8,
        embed_dim=16,
        depth=1,
        num_heads=2,
        num_classes=0,
    ).eval()
    assert vit.blocks[0].attn.fused_attn  # the path that failed before
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    estimate = estimate_pr2(vit, x, 2, torch.Generator().manual_seed(2), create_graph=True)
    estimate.mean().backward()
    grads = [p.grad for p in vit.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert vit.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # through the attention
