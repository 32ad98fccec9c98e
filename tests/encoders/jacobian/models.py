"""Models, images and settings shared by the tests of the Jacobian engine, its cache, store and
planner: small modules with taps, autograd reference spectra, and the engine's settings from the
schema's defaults (the one place they are written)."""

from __future__ import annotations

from typing import Any

import timm
import torch
from torch import nn

from repdiag.core.config import fill_defaults, schema_defaults
from repdiag.encoders.factory import Encoder
from repdiag.encoders.jacobian.engine import DEFAULT_BATCH_SIZE, Spectra
from repdiag.encoders.jacobian.options import JacobianSettings
from repdiag.encoders.jacobian.plan_costs import ModelPlan, TapCost
from repdiag.encoders.preprocess import Preprocess
from repdiag.encoders.taps import tap_plan

F64 = torch.float64

DEFAULTS = schema_defaults("jacobians")
"""The ``jacobians`` section with nothing set: every default the schema gives."""


def engine(**overrides: Any) -> dict[str, Any]:
    """The engine's settings (``jacobian_spectra``'s keywords) at the schema's defaults, with
    ``overrides``."""
    return {**JacobianSettings.from_config(DEFAULTS).engine(), **overrides}


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


def fake_spectra() -> Spectra:
    spectra = Spectra(
        block00=torch.tensor(
            [[3.0, 2.0, 1.0], [1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64
        ),
        head=torch.tensor([[4.0, 3.0, 1.0, 0.5], [2.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]),
    )
    spectra.methods = {"block00": "exact", "head": "randomized"}
    spectra.d_out, spectra.d_in = {"block00": 3, "head": 9}, 48
    return spectra


# ---------------------------------------------------------------- models the planner counts


def planning(**overrides: Any) -> dict[str, Any]:
    """``plan_model``'s settings at the schema's defaults (a null batch size: the CPU's), with
    ``overrides``."""
    settings = {name: DEFAULTS[name] for name in ("method", "k", "power_iters", "chunk_size")}
    return {**settings, "batch_size": DEFAULT_BATCH_SIZE["cpu"], **overrides}


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


def by_name(plan: ModelPlan) -> dict[str, TapCost]:
    return {tap.name: tap for tap in plan.taps}


def hub_and_control_config() -> dict[str, Any]:
    """A config with a hub entry the planner cannot build (no checkout, unknown architecture)
    and a control it can; its ``jacobians`` section filled as a loaded config's is."""
    jacobians = {"k": 4, "power_iters": 1, "batch_size": 8, "chunk_size": 2,
                 "probes": {"binding": {"n": 0}, "noise": {"n": 3}}}  # fmt: skip
    return {
        "jacobians": fill_defaults({"jacobians": jacobians})["jacobians"],
        "embeddings": {"pooling": "cls"},
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
