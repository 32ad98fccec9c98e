"""Steps saved inside one run (save_at): each equals its stop_at retraining bit for bit, meta and
curve included, for a plain objective and one with a teacher (DINO's EMA state)."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.zoo.saved import Snapshots, checkpoint_spec
from repdiag.encoders.zoo.spec import run_spec
from repdiag.encoders.zoo.train import train
from tests.encoders.zoo.conftest import tiny_config

# what differs between two trainings of the same network: the clock and the run's name
NOT_COMPARED = {"wall_time_s", "run"}


def _same_run(saved, stopped) -> None:
    for name, value in stopped.backbone.state_dict().items():
        assert torch.equal(value, saved.backbone.state_dict()[name]), name
    if stopped.head is not None:
        for name, value in stopped.head.state_dict().items():
            assert torch.equal(value, saved.head.state_dict()[name]), name
    assert saved.losses == stopped.losses
    assert {k: v for k, v in saved.meta.items() if k not in NOT_COMPARED} == {
        k: v for k, v in stopped.meta.items() if k not in NOT_COMPARED
    }


@pytest.mark.parametrize(("objective", "steps"), [("supervised", [0, 2]), ("dino", [2])])
def test_a_saved_step_is_its_stop_at_retraining_bit_for_bit(tiny_spec, objective, steps):
    """supervised: the initialisation and a later step, its held-out losses and head, and the
    run itself unchanged by saving; dino: a teacher and centre carried in the state."""
    spec = tiny_spec(objective, steps=3, save_at=steps, warmup_fraction=0.34)
    full = train(spec)
    assert sorted(full.saved) == steps
    for step in steps:
        child = checkpoint_spec(spec, step)
        assert child["run"] == f"{objective}-step{step}" and "save_at" not in child
        _same_run(full.saved[step], train(child))
        assert full.saved[step].meta["steps_trained"] == step
    if objective == "supervised":  # saving changes nothing the run trains
        _same_run(full, train({k: v for k, v in spec.items() if k != "save_at"}))


def test_snapshots_take_only_the_listed_steps_on_the_cpu():
    snapshots = Snapshots({"save_at": [3, 1]}, start=0.0)
    assert [done for done in range(5) if snapshots.due(done)] == [1, 3]
    module = torch.nn.Linear(2, 2)
    snapshots.take(module, 1, [0.5], [])
    module.weight.data.add_(1.0)  # later steps do not reach the copy
    taken = snapshots.taken[0]
    assert taken.step == 1 and taken.losses == [0.5]
    assert not torch.equal(taken.state["weight"], module.weight.detach())
    assert Snapshots({}, start=0.0).steps == frozenset()


def test_the_checkpoint_spec_is_the_workflows_run_of_that_step():
    """run_spec of the declared run `<run>-step<t>` (repdiag.core.series.expand_saved) equals
    checkpoint_spec of the run's spec: the job trains what the config names."""
    config = tiny_config()
    config["zoo"]["objectives"]["simclr"]["save_at"] = [1, 3]
    from repdiag.core.series import expand_saved

    expand_saved(config)
    spec = run_spec(config, "simclr")
    assert spec["save_at"] == [1, 3]
    for step in (1, 3):
        assert run_spec(config, f"simclr-step{step}") == checkpoint_spec(spec, step)
    assert "save_at" not in run_spec(config, "clip")  # unset: not in the params at all


def test_a_saved_step_is_copied_out_whole_or_refused(tmp_path):
    from repdiag.encoders.zoo.checkpoint import copy_saved_step, saved_step_dir

    folder = tmp_path / "saved"
    source = saved_step_dir(folder, 2)
    source.mkdir(parents=True)
    for name, text in (("model.safetensors", "w"), ("curve.csv", "c"), ("meta.json", "m")):
        (source / name).write_text(text)
    out = tmp_path / "run"
    out.mkdir()
    copy_saved_step(folder, 2, out / "model.safetensors", out / "meta.json", out / "curve.csv")
    assert [(out / n).read_text() for n in ("model.safetensors", "meta.json", "curve.csv")] == [
        "w", "m", "c",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"step 3 was not saved by its run"):
        copy_saved_step(folder, 3, out / "a", out / "b", out / "c")
