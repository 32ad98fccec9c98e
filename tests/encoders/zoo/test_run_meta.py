"""meta.json of a run: the steps it took and the record of its settings."""

from __future__ import annotations

import torch

from repdiag.encoders.zoo.run_meta import run_meta, steps_trained


def test_steps_trained_is_stop_at_of_the_schedule_or_every_step():
    assert steps_trained({"steps": 5, "stop_at": None}) == 5
    assert steps_trained({"steps": 5, "stop_at": 2}) == 2
    assert steps_trained({"steps": 5, "stop_at": 9}) == 5
    assert steps_trained({"steps": 5}) == 5


def test_the_record_reads_the_spec_and_the_losses(tiny_spec):
    from repdiag.encoders.zoo.train import build_objective

    spec = tiny_spec("supervised", steps=4, stop_at=3)
    objective, kwargs = build_objective(spec, "cpu")
    backbone, head = objective.export()
    preprocess = {"input_size": 32, "mean": [0.0] * 3, "std": [1.0] * 3}
    losses = [4.0, 3.0, 2.0]
    meta = run_meta(spec, kwargs, preprocess, backbone, head, losses, 1.23456, "cpu")
    assert meta["steps"] == 4 and meta["steps_trained"] == 3
    assert (meta["initial_loss"], meta["final_loss"]) == (4.0, 2.0)
    assert meta["final_loss_mean"] == 2.0  # the last tenth: at least one loss
    assert meta["wall_time_s"] == 1.235 and meta["device"] == "cpu"
    assert meta["threads"] == torch.get_num_threads() and meta["run"] == spec["run"]
    assert meta["feature_dim"] == backbone.num_features
