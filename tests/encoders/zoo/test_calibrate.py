"""The calibration pilot: its gradient-norm ratios against an independent autograd computation on
a tiny run, measuring leaves the run as it was, and the suggested weight's closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from repdiag.encoders.jer_estimator import estimate_pr2
from repdiag.encoders.zoo.calibrate import (
    PilotSettings,
    calibration_summary,
    gradient_norms,
    measured_steps,
    pilot,
)
from repdiag.encoders.zoo.scenes import scene_batch
from repdiag.encoders.zoo.train import (
    build_objective,
    make_optimizer,
    probe_generator,
    to_batch,
    train_step,
)

REGULARISER = {"weight": 0.5, "images": 2, "probes": 2}


def independent_norms(spec: dict, step: int) -> tuple[float, float]:
    """Both backbone gradient norms at ``step`` of the plain run, by another route: train the
    plain run ``step`` steps, then ``.backward()`` each term on its own and read ``.grad``."""
    plain = {**spec, "jer_regulariser": {}}
    objective, _ = build_objective(plain)
    objective.train()
    optimizer = make_optimizer(objective, plain)
    gen = torch.Generator().manual_seed(plain["seed"])
    for t in range(step):
        train_step(objective, optimizer, plain, t, gen)
    batch = to_batch(scene_batch(objective.scenes, plain["scenes"]["seed"], step, 8), "cpu")
    backbone = objective.backbone

    def norm() -> float:
        grads = [p.grad.double().flatten() for p in backbone.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.cat(grads)))

    objective.zero_grad(set_to_none=True)
    objective.loss(batch, gen).backward()
    objective_norm = norm()
    objective.zero_grad(set_to_none=True)
    backbone.eval()
    x = objective.normalize(batch.images[: REGULARISER["images"]])
    generator = probe_generator(plain, step)
    estimate_pr2(backbone, x, REGULARISER["probes"], generator, create_graph=True).mean().backward()
    return objective_norm, norm()


def test_the_pilot_reports_the_ratios_an_independent_computation_gives(tiny_spec):
    spec = tiny_spec("supervised_resnet", steps=4, jer_regulariser=REGULARISER)
    rows = pilot(spec, PilotSettings(every=2))
    assert rows["step"].tolist() == [0, 2, 3]
    for _, row in rows.iterrows():
        objective_norm, jer_norm = independent_norms(spec, int(row["step"]))
        assert row["objective_grad_norm"] == pytest.approx(objective_norm, rel=1e-5)
        assert row["jer_grad_norm"] == pytest.approx(jer_norm, rel=1e-5)
        assert row["ratio"] == pytest.approx(0.5 * jer_norm / objective_norm, rel=1e-5)
    assert (rows["objective_grad_norm"] > 0).all() and (rows["jer_grad_norm"] > 0).all()


def test_measuring_leaves_the_weights_buffers_and_augmentations_alone(tiny_spec):
    spec = tiny_spec("supervised_resnet", steps=2)
    objective, _ = build_objective(spec)
    objective.train()
    gen = torch.Generator().manual_seed(0)
    before = {name: value.clone() for name, value in objective.state_dict().items()}
    gen_before = gen.get_state()
    batch = to_batch(scene_batch(objective.scenes, 1, 0, 8), "cpu")
    norms = gradient_norms(objective, batch, REGULARISER, torch.Generator().manual_seed(1), gen)
    assert all(np.isfinite(norms)) and min(norms) > 0
    assert torch.equal(gen.get_state(), gen_before)
    for name, value in objective.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_summary_and_the_weight_for_the_target():
    rows = pd.DataFrame(
        {
            "run": ["a"] * 3,
            "step": [0, 10, 19],
            "objective_grad_norm": [1.0, 2.0, 4.0],
            "jer_grad_norm": [4.0, 4.0, 4.0],
            "ratio_per_unit_weight": [4.0, 2.0, 1.0],
            "weight": [0.1] * 3,
            "ratio": [0.4, 0.2, 0.1],
        }
    )
    summary = calibration_summary(rows, PilotSettings(target=0.2)).iloc[0]
    assert summary["ratio_median"] == pytest.approx(0.2)
    assert (summary["ratio_min"], summary["ratio_max"]) == pytest.approx((0.1, 0.4))
    assert summary["share_in_range"] == pytest.approx(2 / 3)
    assert summary["weight_for_target"] == pytest.approx(0.2 / 2.0)  # target / median per unit
    assert measured_steps(20, 10) == [0, 10, 19] and measured_steps(0, 5) == []
    with pytest.raises(ValueError, match="every"):
        PilotSettings(every=0)


def test_the_command_prints_the_summary_and_writes_every_step(tmp_path, capsys):
    """`python -m repdiag.encoders.zoo.calibrate` on a config file: the first 2 steps of a run
    with a regulariser, measured at both; the CSV holds the steps the summary sums up."""
    import yaml

    from repdiag.encoders.zoo.calibrate import main
    from tests.planning import tiny_config

    config = tiny_config()
    config["zoo"]["objectives"]["supervised"]["jer_regulariser"] = {"weight": 0.1, "images": 2}
    config["models"]["supervised"]["family"] = "jer_intervention"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "steps.csv"
    main(["--config", str(path), "supervised", "--steps", "2", "--every", "1", "--out", str(out)])
    rows = pd.read_csv(out)
    assert rows["step"].tolist() == [0, 1] and (rows["weight"] == 0.1).all()
    assert np.allclose(rows["ratio"], 0.1 * rows["jer_grad_norm"] / rows["objective_grad_norm"])
    printed = capsys.readouterr().out
    assert "weight_for_target" in printed and "supervised" in printed
