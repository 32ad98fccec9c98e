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


@pytest.mark.parametrize(("objective", "steps"), [("supervised", [0, 1]), ("dino", [1])])
def test_a_saved_step_is_its_stop_at_retraining_bit_for_bit(tiny_spec, objective, steps):
    """supervised: the initialisation and step 1 of 2, its held-out losses and head, and the
    run itself unchanged by saving; dino: a teacher and centre carried in the state."""
    spec = tiny_spec(objective, steps=2, save_at=steps, warmup_fraction=0.5)
    full = train(spec, "cpu")
    assert sorted(full.saved) == steps
    for step in steps:
        child = checkpoint_spec(spec, step)
        assert child["run"] == f"{objective}-step{step}" and "save_at" not in child
        _same_run(full.saved[step], train(child, "cpu"))
        assert full.saved[step].meta["steps_trained"] == step
    if objective == "supervised":  # saving changes nothing the run trains
        _same_run(full, train({k: v for k, v in spec.items() if k != "save_at"}, "cpu"))


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


def test_a_saved_step_is_written_out_as_the_run_files_or_refused(tmp_path, tiny_spec):
    """One bundle for the saved steps; a step copied out is the three files save_zoo_run writes
    for the step's result (weights and meta with its digest, curve), the bundle checked against
    the digest the run's meta.json recorded."""
    from repdiag.core.errors import EncoderError
    from repdiag.core.store import write_json
    from repdiag.encoders.zoo.checkpoint import copy_saved_step, save_saved_steps, save_zoo_run

    result = train(tiny_spec("supervised", steps=2, save_at=[1]), "cpu")
    bundle = tmp_path / "saved.safetensors"
    write_json(tmp_path / "meta.json", {"saved_sha256": save_saved_steps(result.saved, bundle)})
    names = ("model.safetensors", "meta.json", "curve.csv")
    direct, copied = tmp_path / "direct", tmp_path / "copied"
    for folder in (direct, copied):
        folder.mkdir()
    step = result.saved[1]
    save_zoo_run(step.backbone, step.head, step.meta, step.losses, *(direct / n for n in names))
    out = {"model": copied / names[0], "meta": copied / names[1], "curve": copied / names[2]}
    copy_saved_step(bundle, 1, tmp_path / "meta.json", out)
    for name in names:
        assert (copied / name).read_bytes() == (direct / name).read_bytes(), name
    with pytest.raises(EncoderError, match=r"step 2 was not saved by its run \(saved: \[1\]\)"):
        copy_saved_step(bundle, 2, tmp_path / "meta.json", out)
    write_json(tmp_path / "meta.json", {"saved_sha256": "0" * 64})  # another run's bundle
    with pytest.raises(EncoderError, match=r"SHA-256"):
        copy_saved_step(bundle, 1, tmp_path / "meta.json", out)
