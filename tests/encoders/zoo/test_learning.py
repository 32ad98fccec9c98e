"""The zoo as a controlled experiment: the default config's runs, their trivial losses, the
SimMIM objective and the learning check."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from repdiag.core.config import load_config
from repdiag.encoders.zoo.learning import plateau_check, same_weights, slot_probe_accuracy
from repdiag.encoders.zoo.objectives.clip import clip_loss
from repdiag.encoders.zoo.objectives.simclr import nt_xent_loss
from repdiag.encoders.zoo.objectives.simmim import simmim_loss
from repdiag.encoders.zoo.objectives.supervised import supervised_loss
from repdiag.encoders.zoo.objectives.vicreg import vicreg_loss
from repdiag.encoders.zoo.scenes import bag_caption, scene_batch
from repdiag.encoders.zoo.spec import FAMILIES, run_spec, tells_binding, zoo_runs
from repdiag.encoders.zoo.train import build_objective, make_optimizer, to_batch, train

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = pytest.mark.xdist_group("encoders/zoo/test_learning")

REPO = Path(__file__).resolve().parents[3]


DEFAULT = load_config(REPO / "config/config.yaml")


@pytest.fixture(scope="module")
def short_runs():
    torch.set_num_threads(1)
    base = run_spec(DEFAULT, "supervised_slots")
    return {
        "zero": train({**base, "steps": 0}, "cpu"),
        "short": train({**base, "steps": 60, "batch_size": 32, "lr": 3e-3}, "cpu"),
    }


def test_default_zoo_is_one_backbone_seven_objectives_two_seeds_position_free():
    """The default run's zoo (binding_families' ResNet and ViT runs are on request, apart)."""
    from repdiag.binding.family_options import family_models

    compared = set(family_models(DEFAULT))
    runs = {run: run_spec(DEFAULT, run) for run in zoo_runs(DEFAULT) if run not in compared}
    assert {spec["backbone"] for spec in runs.values()} == {"resnet"}
    family_runs = {r: s for r, s in runs.items() if s["family"] in set(FAMILIES.values())}
    objectives = [s["objective"] for s in family_runs.values()]
    assert set(objectives) == set(FAMILIES) - {"mae"}  # simmim is the ConvNet's masked modelling
    assert all(objectives.count(o) >= 2 for o in set(objectives))  # at least two seeds each
    for run, spec in family_runs.items():
        assert not tells_binding(spec["objective"], spec["hparams"]), run
        if spec["objective"] == "supervised":
            assert spec["hparams"]["label"] == "shape_presence"
        if spec["objective"] == "clip":
            assert spec["hparams"]["captions"] == "bag"
    assert runs["supervised_slots"]["family"] == "binding_supervised"
    assert runs["clip_relational"]["family"] == "binding_supervised"
    assert runs["random_resnet"]["family"] == "control" and runs["random_resnet"]["steps"] == 0
    scenes, binding = DEFAULT["zoo"]["scenes"], DEFAULT["datasets"]["binding"]
    assert scenes["grid"] == binding["grid"] and scenes["object_size"] == binding["object_size"]
    assert scenes["jitter"] == binding["jitter"]


def test_bag_captions_say_nothing_of_positions():
    spec = run_spec(DEFAULT, "clip_s0")
    objective, _ = build_objective(spec, "cpu")
    batch = to_batch(scene_batch(objective.scenes, 1, 0, 64), "cpu")
    texts = objective.caption_texts(batch)
    positions = {"top", "bottom", "left", "right", "middle", "centre"}
    assert all(not positions & set(text.replace(",", " ").split()) for text in texts)
    # the same objects in other slots give the same caption
    shapes, colours = batch.slot_shape[0].tolist(), batch.slot_colour[0].tolist()
    assert bag_caption(shapes[::-1], colours[::-1], objective.scenes) == texts[0]
    relational, _ = build_objective(run_spec(DEFAULT, "clip_relational"), "cpu")
    assert relational.caption_texts(batch) == batch.captions


def test_trivial_losses_equal_the_loss_of_the_trivial_solution():
    batch = to_batch(
        scene_batch(build_objective(run_spec(DEFAULT, "simclr_s0"), "cpu")[0].scenes, 1, 0, 32),
        "cpu",
    )
    b = batch.images.shape[0]
    constant = torch.ones(b, 8, dtype=torch.float64)
    simclr, _ = build_objective(run_spec(DEFAULT, "simclr_s0"), "cpu")
    assert simclr.trivial_loss(batch) == pytest.approx(
        float(nt_xent_loss(constant, constant, 0.2)), rel=1e-9
    )
    clip, _ = build_objective(run_spec(DEFAULT, "clip_s0"), "cpu")
    assert clip.trivial_loss(batch) == pytest.approx(float(clip_loss(constant, constant, 10.0)))
    vicreg, _ = build_objective(run_spec(DEFAULT, "vicreg_s0"), "cpu")
    assert vicreg.trivial_loss(batch) == pytest.approx(
        float(vicreg_loss(constant, constant, **vicreg.coeffs))
    )
    dino, _ = build_objective(run_spec(DEFAULT, "dino_s0"), "cpu")
    assert dino.trivial_loss(batch) == pytest.approx(math.log(256))
    supervised, _ = build_objective(run_spec(DEFAULT, "supervised_s0"), "cpu")
    targets = supervised.targets(batch.slot_shape, torch.zeros(b, dtype=torch.bool))
    prior = torch.nn.functional.one_hot(targets, 2).double().mean(dim=0)  # (groups, classes)
    logits = prior.clamp(min=1e-12).log().expand(b, -1, -1)
    assert supervised.trivial_loss(batch) == pytest.approx(
        float(supervised_loss(logits, targets, 0.0)), rel=1e-6
    )
    simmim, _ = build_objective(run_spec(DEFAULT, "simmim_s0"), "cpu")
    x = simmim.normalize(batch.images)
    median = x.transpose(0, 1).flatten(1).median(dim=1).values.view(1, 3, 1, 1)
    full = torch.ones(b, 1, 64, 64)
    assert simmim.trivial_loss(batch) == pytest.approx(
        float(simmim_loss(median.expand_as(x), x, full)), rel=1e-6
    )


@pytest.mark.parametrize("run", [f"{o}_s0" for o in sorted(set(FAMILIES) - {"mae"})])
def test_loss_decreases_on_the_default_backbone(run):
    torch.set_num_threads(1)
    spec = {
        **run_spec(DEFAULT, run),
        "steps": 20,  # on one fixed batch
        "batch_size": 16,
        "lr": 3e-3,
        "warmup_fraction": 0.0,
    }
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, spec)
    batch = to_batch(scene_batch(objective.scenes, 0, 0, 16), "cpu")
    gen = torch.Generator().manual_seed(0)
    losses = []
    for step in range(spec["steps"]):
        loss = objective.loss(batch, gen)
        optimizer.zero_grad()
        loss.backward()
        objective.before_update(step, spec["steps"])
        optimizer.step()
        objective.after_step(step, spec["steps"])
        losses.append(loss.item())
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert last < first - 0.05 * abs(first), f"{run}: {first:.4f} -> {last:.4f}"


def test_plateau_rule_closed_form():
    assert plateau_check([2.0] * 10 + [1.0] * 10, trivial_loss=1.5)["left_plateau"]
    assert not plateau_check([2.0] * 20, trivial_loss=3.0)["left_plateau"]  # never moved
    # went down from its start but not below the trivial solution's loss: still on the plateau
    assert not plateau_check([3.0] + [1.0] * 19, trivial_loss=1.0)["left_plateau"]
    assert not plateau_check([2.0], trivial_loss=3.0)["left_plateau"]  # zero steps


def test_slot_probe_reads_labels_that_are_in_the_features():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=(400, 4))
    informative = np.concatenate([np.eye(5)[labels[:, s]] for s in range(4)], axis=1)
    noise = rng.normal(size=(400, 20))
    assert (
        slot_probe_accuracy(informative + 0.1 * rng.normal(size=informative.shape), labels) > 0.95
    )
    assert slot_probe_accuracy(noise, labels) < 0.35


def test_a_zero_step_run_is_flagged_not_learned(short_runs):
    learning = short_runs["zero"].meta["learning"]
    assert not learning["left_plateau"] and not learning["learned"]
    assert learning["slot_probe_accuracy"] == learning["slot_probe_accuracy_random_init"]


def test_a_short_supervised_run_on_its_scenes_is_flagged_learned(short_runs):
    learning = short_runs["short"].meta["learning"]
    assert learning["left_plateau"] and learning["learned"], learning
    # told the slots, it also reads them better than its random initialisation
    assert learning["slot_probe_gain"] > 0.02 and learning["beats_random_init"], learning


def test_same_weights_compares_every_tensor_bit_for_bit():
    first = torch.nn.Linear(3, 2)
    second = torch.nn.Linear(3, 2)
    second.load_state_dict(first.state_dict())
    assert same_weights(first, second)
    with torch.no_grad():
        second.bias[0] = torch.nextafter(second.bias[0], torch.tensor(2.0))
    assert not same_weights(first, second)
    assert not same_weights(first, torch.nn.Linear(3, 2, bias=False))
