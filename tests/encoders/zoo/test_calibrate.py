"""The calibration pilot: the share of the AdamW step a unit-weight push takes, against an
independent computation through torch's own AdamW step on a tiny run; measuring leaves the run
as it was; the suggested weight's closed form; the command."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from repdiag.encoders.zoo.calibrate import (
    PilotSettings,
    calibration_summary,
    measured_steps,
    pilot,
    step_shares,
)
from repdiag.encoders.zoo.regulariser import (
    RegulariserSettings,
    global_pr_penalty,
    jer_penalty,
    probe_generator,
)
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import (
    build_objective,
    learning_rate,
    make_optimizer,
    to_batch,
    train_step,
)

pytestmark = pytest.mark.xdist_group("encoders/zoo/test_calibrate")

REGULARISER = {"weight": 0.5, "images": 2, "probes": 2}


def independent_shares(spec: dict, step: int) -> dict[str, float]:
    """Another route to the shares at ``step`` of the plain run: train ``step`` plain steps,
    backward the objective, clip with torch, take torch's AdamW step on a copy and read the
    step it made, u = theta (1 - lr wd) - theta'; the push's part is lr c g_term / (sqrt(v_hat')
    + eps) from that copy's state after its step."""
    plain = {**spec, "jer_regulariser": {}}
    objective, _ = build_objective(plain, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, plain)
    gen = torch.Generator().manual_seed(plain["seed"])
    for t in range(step):
        train_step(objective, optimizer, plain, t, gen)
    batch = to_batch(
        scene_batch(objective.scenes, plain["scenes"]["seed"], step, plain["batch_size"]), "cpu"
    )
    lr = learning_rate(step, plain["steps"], plain["lr"], plain["warmup_fraction"])
    copy_objective = copy.deepcopy(objective)
    copy_optimizer = make_optimizer(copy_objective, plain)
    copy_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for group in copy_optimizer.param_groups:
        group["lr"] = lr
    copy_objective.zero_grad(set_to_none=True)
    copy_objective.loss(batch, gen).backward()  # train mode: BatchNorm's statistics move first
    copy_backbone = [p for p in copy_objective.backbone.parameters() if p.requires_grad]
    term_grads = {}
    for term in ("jer", "global_pr"):
        settings = RegulariserSettings(term=term, weight=1.0, images=2, probes=2)
        if term == "jer":
            value = jer_penalty(
                copy_objective, batch, settings, probe_generator(plain["seed"], step)
            )
        else:
            value = global_pr_penalty(copy_objective, batch)
        grads = torch.autograd.grad(value, copy_backbone, allow_unused=True)
        term_grads[term] = [
            torch.zeros_like(p) if g is None else g
            for p, g in zip(copy_backbone, grads, strict=True)
        ]
    trainable = [p for _, p in copy_objective.trainable_parameters()]
    norm = float(torch.nn.utils.clip_grad_norm_(trainable, plain["grad_clip"]))
    clip = min(1.0, plain["grad_clip"] / (norm + 1e-6)) if plain["grad_clip"] > 0 else 1.0
    before = [p.detach().clone().double() for p in copy_backbone]
    copy_optimizer.step()
    u2, q2 = 0.0, {term: 0.0 for term in term_grads}
    for k, p in enumerate(copy_backbone):
        group = next(g for g in copy_optimizer.param_groups if any(q is p for q in g["params"]))
        u = before[k] * (1 - lr * group["weight_decay"]) - p.detach().double()
        u2 += float(u.square().sum())
        state = copy_optimizer.state[p]
        _, beta2 = group["betas"]
        v_hat = state["exp_avg_sq"].double() / (1 - beta2 ** float(state["step"]))
        for term, grads in term_grads.items():
            q = lr * clip * grads[k].double() / (v_hat.sqrt() + group["eps"])
            q2[term] += float(q.square().sum())
    return {term: math.sqrt(q2[term] / u2) for term in term_grads}


def test_the_pilot_reports_the_shares_an_independent_computation_gives(tiny_spec):
    spec = tiny_spec("supervised_resnet", steps=4, jer_regulariser=REGULARISER)
    rows = pilot(spec, PilotSettings.from_config(dict(every=2)))
    assert sorted(set(rows["step"])) == [0, 2, 3] and set(rows["term"]) == {"jer", "global_pr"}
    for step in (0, 3):
        expected = independent_shares(spec, step)
        got = rows[rows["step"] == step].set_index("term")["share_per_unit_weight"]
        for term, share in expected.items():
            assert got[term] == pytest.approx(share, rel=1e-4), (step, term)
    assert (rows["share_per_unit_weight"] > 0).all()


def test_measuring_leaves_the_weights_buffers_optimizer_and_augmentations_alone(tiny_spec):
    spec = tiny_spec("supervised_resnet", steps=2, jer_regulariser=REGULARISER)
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(0)
    train_step(objective, optimizer, {**spec, "jer_regulariser": {}}, 0, gen)
    before = {name: value.clone() for name, value in objective.state_dict().items()}
    moments = copy.deepcopy(optimizer.state_dict())
    gen_before = gen.get_state()
    batch = to_batch(scene_batch(objective.scenes, 1, 1, 8), "cpu")
    shares = step_shares(objective, optimizer, batch, spec, 1, gen, RegulariserSettings.of(spec))
    assert all(np.isfinite(list(shares.values()))) and min(shares.values()) > 0
    assert torch.equal(gen.get_state(), gen_before)
    for name, value in objective.state_dict().items():
        assert torch.equal(value, before[name]), name
    after = optimizer.state_dict()["state"]
    for index, state in moments["state"].items():
        assert torch.equal(after[index]["exp_avg"], state["exp_avg"])


def test_the_summary_and_the_weight_for_the_target():
    rows = pd.DataFrame(
        {
            "run": ["a"] * 6,
            "step": [0, 10, 19] * 2,
            "term": ["jer"] * 3 + ["global_pr"] * 3,
            "share_per_unit_weight": [400.0, 200.0, 100.0, 1.0, 2.0, 3.0],
        }
    )
    summary = calibration_summary(rows, PilotSettings.from_config(dict(target=0.5))).set_index(
        "term"
    )
    assert summary.loc["jer", "share_per_unit_weight_median"] == pytest.approx(200.0)
    assert summary.loc["jer", "weight_for_target"] == pytest.approx(0.5 / 200.0)
    assert summary.loc["global_pr", "weight_for_target"] == pytest.approx(0.25)
    assert summary.loc["jer", "share_per_unit_weight_p10"] == pytest.approx(
        np.percentile([400, 200, 100], 10)
    )
    assert measured_steps(20, 10) == [0, 10, 19] and measured_steps(0, 5) == []
    with pytest.raises(ValueError, match="every"):
        PilotSettings.from_config(dict(every=0))


def test_the_command_prints_the_summary_and_writes_every_step(tmp_path, capsys):
    """`repdiag calibrate` on a config file: the first 2 steps of a run,
    measured at both, for both terms."""
    import yaml

    from repdiag.encoders.zoo.calibrate import main
    from tests.planning import tiny_config

    config = tiny_config()
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "steps.csv"
    main(["--config", str(path), "supervised", "--steps", "2", "--every", "1", "--out", str(out)])
    rows = pd.read_csv(out)
    assert rows["step"].tolist() == [0, 0, 1, 1] and set(rows["term"]) == {"jer", "global_pr"}
    printed = capsys.readouterr().out
    assert "weight_for_target" in printed and "supervised" in printed
