"""Every zoo objective: registered with its family and schema defaults, learns on tiny data,
exports a backbone and head that rebuild from meta.json alone."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from repdiag.encoders.zoo.heads import build_head
from repdiag.encoders.zoo.objectives import OBJECTIVES
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.spec import FAMILIES
from repdiag.encoders.zoo.train import build_objective, make_optimizer, to_batch

SCHEMA = Path(__file__).resolve().parents[4] / "schemas" / "zoo.schema.yaml"


def schema_hparams() -> dict[str, dict[str, object]]:
    props = yaml.safe_load(SCHEMA.read_text())["properties"]["hparams"]["properties"]
    return {
        name: {k: v["default"] for k, v in sub["properties"].items()} for name, sub in props.items()
    }


# steps and learning rates that make each objective's decrease clear on one fixed tiny batch
LEARNING = {
    "barlow_twins": (30, 3e-3),
    "vicreg": (30, 3e-3),
    "mae": (30, 3e-3),
    "simmim": (30, 3e-3),
    "dino": (40, 1e-3),
    "simclr": (30, 3e-3),
    "clip": (30, 3e-3),
    "supervised": (30, 3e-3),
    "supervised_resnet": (30, 3e-3),
}


def test_registry_families_and_schema_agree():
    assert OBJECTIVES.names() == sorted(FAMILIES)
    hparams = schema_hparams()
    assert sorted(hparams) == sorted(FAMILIES)
    for name in OBJECTIVES:
        cls = OBJECTIVES.get(name)
        assert cls.family == FAMILIES[name]
        params = inspect.signature(cls.__init__).parameters
        code = {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        # the schema is the one home of the defaults: every hparam is a required keyword
        assert sorted(code) == sorted(hparams[name]), name
        assert all(default is inspect.Parameter.empty for default in code.values()), name


@pytest.mark.parametrize("run", sorted(LEARNING))
def test_loss_decreases_on_tiny_data(run, tiny_spec):
    steps, lr = LEARNING[run]
    spec = tiny_spec(run, steps=steps, lr=lr, batch_size=16, warmup_fraction=0.0)
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, spec)
    batch = to_batch(scene_batch(objective.scenes, 0, 0, 16), "cpu")  # the same 16 scenes
    gen = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        loss = objective.loss(batch, gen)
        optimizer.zero_grad()
        loss.backward()
        objective.before_update(step, steps)
        optimizer.step()
        objective.after_step(step, steps)
        losses.append(loss.item())
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert np.all(np.isfinite(losses))
    assert last < first - 0.05 * abs(first), f"{run}: {first:.4f} -> {last:.4f}"


@pytest.mark.parametrize("run", sorted(LEARNING))
def test_export_rebuilds_from_its_description(run, tiny_spec):
    objective, _ = build_objective(tiny_spec(run), "cpu")
    backbone, head = objective.export()
    x = torch.rand(3, 3, 32, 32)
    backbone.eval()
    features = backbone(x)
    assert features.shape == (3, backbone.num_features)
    if run in ("mae", "simmim"):
        assert head is None  # a pixel decoder, no projection head
        return
    rebuilt = build_head({**head.description, "input": "final"})
    assert list(rebuilt.state_dict()) == list(head.state_dict())
    rebuilt.load_state_dict(head.state_dict(), strict=True)
    head.eval(), rebuilt.eval()
    assert torch.equal(rebuilt(features), head(features))


@pytest.mark.parametrize("run", ["supervised_resnet", "simmim", "dino"])
def test_a_convnet_objective_runs_channels_last_with_the_loss_of_nchw(run, tiny_spec):
    """On the CPU a ConvNet's weights and inputs are channels_last (oneDNN's layout); the layout
    changes the loss by float rounding only. A ViT keeps the default layout."""
    spec = tiny_spec(run)
    objective, _ = build_objective(spec, "cpu")
    batch = to_batch(scene_batch(objective.scenes, 0, 0, 8), "cpu")
    is_cnn = run != "dino"  # the tiny config's dino is a ViT
    expected = torch.channels_last if is_cnn else torch.contiguous_format
    assert objective.input_format == expected
    assert objective.normalize(batch.images).is_contiguous(memory_format=expected)
    if not is_cnn:
        return
    conv = next(m for m in objective.backbone.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    nchw, _ = build_objective(spec, "cpu")
    nchw.use_memory_format(torch.contiguous_format)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)  # a separate module
    objective.train(), nchw.train()
    got = objective.loss(batch, torch.Generator().manual_seed(1))
    reference = nchw.loss(batch, torch.Generator().manual_seed(1))
    assert got.item() == pytest.approx(reference.item(), rel=1e-4)
