"""Every objective: registered with its family and schema defaults, learns on tiny data, exports
a backbone and head that rebuild from meta.json alone."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from repdiag.binding.scenes import scene_batch
from repdiag.encoders.zoo.heads import build_head
from repdiag.encoders.zoo.objectives import OBJECTIVES
from repdiag.encoders.zoo.objectives.supervised import mirror_slots
from repdiag.encoders.zoo.spec import FAMILIES
from repdiag.encoders.zoo.train import build_objective, make_optimizer, to_batch

SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / "zoo.schema.yaml"


def schema_hparams() -> dict[str, dict[str, object]]:
    props = yaml.safe_load(SCHEMA.read_text())["properties"]["hparams"]["properties"]
    return {
        name: {k: v["default"] for k, v in sub["properties"].items()} for name, sub in props.items()
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
        # the schema is the source of defaults; the code's keyword defaults must say the same
        assert sorted(code) == sorted(hparams[name]), name
        for key, default in hparams[name].items():
            assert list(code[key]) == default if isinstance(default, list) else code[key] == default


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


@pytest.mark.parametrize("run", sorted(LEARNING))
def test_loss_decreases_on_tiny_data(run, tiny_spec):
    steps, lr = LEARNING[run]
    spec = tiny_spec(run, steps=steps, lr=lr, batch_size=16, warmup_fraction=0.0)
    objective, _ = build_objective(spec)
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
    objective, _ = build_objective(tiny_spec(run))
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


def test_dino_exports_the_teacher_and_updates_it_by_ema(tiny_spec):
    objective, _ = build_objective(tiny_spec("dino"))
    backbone, head = objective.export()
    assert backbone is objective.teacher_backbone and head is objective.teacher_head.mlp
    before = [p.clone() for p in objective.teacher_backbone.parameters()]
    with torch.no_grad():
        for p in objective.backbone.parameters():
            p.add_(1.0)
    objective.after_step(0, 11)  # momentum 0.99 at step 0
    for old, new, student in zip(
        before,
        objective.teacher_backbone.parameters(),
        objective.backbone.parameters(),
        strict=True,
    ):
        assert torch.allclose(new, 0.99 * old + 0.01 * student)


def test_dino_freezes_the_prototypes_at_first(tiny_spec):
    objective, _ = build_objective(tiny_spec("dino"))
    objective.head.prototypes.grad = torch.ones_like(objective.head.prototypes)
    objective.before_update(0, 100)  # freeze_prototypes_fraction 0.1: steps 0..9
    assert objective.head.prototypes.grad is None
    objective.head.prototypes.grad = torch.ones_like(objective.head.prototypes)
    objective.before_update(10, 100)
    assert objective.head.prototypes.grad is not None


def test_mae_masks_the_configured_fraction(tiny_spec):
    objective, _ = build_objective(tiny_spec("mae"))
    keep = objective.random_keep(4, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert keep.shape == (4, 4)  # 32 px / patch 8 = 16 patches, 25 % visible
    assert all(len(set(row.tolist())) == 4 for row in keep)


def test_supervised_mirrors_slot_labels_with_the_image(tiny_spec):
    assert mirror_slots((2, 3)).tolist() == [2, 1, 0, 5, 4, 3]
    spec = tiny_spec("supervised")
    objective, _ = build_objective({**spec, "hparams": {**spec["hparams"], "label": "slot_shape"}})
    scenes = scene_batch(objective.scenes, 0, 3, 16)
    batch = to_batch(scenes, "cpu")
    x, flipped = objective.view.apply(batch.images, torch.Generator().manual_seed(1))
    targets = objective.targets(batch.slot_shape, flipped)
    assert flipped.any() and (~flipped).any()
    # a slot is occupied in the augmented image iff its (mirrored) label says so; the tiny
    # config's background levels are <= 48/255 and jitter preserves the cell of every object
    grey = x.mean(dim=1)
    for b in range(16):
        for slot in range(4):
            r, c = divmod(slot, 2)
            cell = grey[b, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16]
            occupied = bool((cell - cell.amin()).amax() > 0.05)
            assert occupied == bool(targets[b, slot] > 0), (b, slot)
