"""Training is seeded and deterministic; checkpoints reload to bitwise identical features, and a
missing, truncated or mismatched checkpoint is a clear error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import load_file

from repdiag.core.errors import EncoderError
from repdiag.encoders.zoo.checkpoint import load_zoo_model, save_zoo_run
from repdiag.encoders.zoo.plot import read_curve
from repdiag.encoders.zoo.train import learning_rate, parameter_groups, train

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = pytest.mark.xdist_group("encoders/zoo/test_train")


def save(result, run_dir):
    save_zoo_run(
        result.backbone,
        result.head,
        result.meta,
        result.losses,
        run_dir / "model.safetensors",
        run_dir / "meta.json",
        run_dir / "curve.csv",
    )
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two tiny runs: clip (ViT, with a head) and supervised_resnet (CNN), saved to disk."""
    from repdiag.encoders.zoo.spec import run_spec
    from tests.encoders.zoo.conftest import tiny_config

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("zoo")
    out = {}
    for run in ("clip", "supervised_resnet"):
        spec = run_spec(tiny_config(), run)
        result = train(spec, "cpu")
        out[run] = (spec, result, save(result, root / run))
    return out


def test_learning_rate_schedule_closed_form():
    assert learning_rate(0, 100, 1.0, 0.1) == pytest.approx(0.1)  # (0 + 1) / 10
    assert learning_rate(9, 100, 1.0, 0.1) == pytest.approx(1.0)
    assert learning_rate(10, 100, 1.0, 0.1) == pytest.approx(1.0)  # cosine starts at the peak
    assert learning_rate(55, 100, 1.0, 0.1) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(0, 4, 2.0, 0.0) == pytest.approx(2.0)


def test_weight_decay_only_on_matrices(tiny_spec):
    from repdiag.encoders.zoo.train import build_objective

    objective, _ = build_objective(tiny_spec("mae"), "cpu")
    decay, no_decay = parameter_groups(objective, 0.05)
    names = {id(p): n for n, p in objective.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    skipped = {names[id(p)] for p in no_decay["params"]}
    tokens = {"backbone.pos_embed", "backbone.cls_token", "mask_token"}
    assert tokens <= skipped
    assert all(objective.get_parameter(n).ndim == 1 for n in skipped - tokens)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(objective.parameters()))


def test_same_seed_same_weights_other_seed_other_weights(tiny_spec):
    spec = tiny_spec("simclr", steps=3)
    a, b = train(spec, "cpu"), train(spec, "cpu")
    c = train({**spec, "seed": 1}, "cpu")
    state_a, state_b, state_c = (
        a.backbone.state_dict(),
        b.backbone.state_dict(),
        c.backbone.state_dict(),
    )
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert a.losses == b.losses
    assert not all(torch.equal(state_a[k], state_c[k]) for k in state_a)


def test_meta_and_curve_follow_the_contract(trained):
    spec, result, run_dir = trained["clip"]
    meta = json.loads((run_dir / "meta.json").read_text())
    for key in ("objective", "family", "timm_model", "timm_kwargs", "pooling", "preprocess", "head",
                "steps", "batch_size", "seed", "final_loss", "wall_time_s"):  # fmt: skip
        assert key in meta, key
    assert meta["objective"] == "clip" and meta["family"] == "vision_language"
    assert meta["pooling"] == "cls" and meta["timm_kwargs"]["num_classes"] == 0
    assert meta["preprocess"]["input_size"] == 32 and len(meta["preprocess"]["mean"]) == 3
    assert meta["head"]["dims"] == [32, 32] and meta["head"]["bias"] is False
    losses = read_curve(run_dir / "curve.csv")
    assert losses.tolist() == result.losses and len(losses) == spec["steps"]
    assert meta["final_loss"] == result.losses[-1]
    resnet_meta = json.loads((trained["supervised_resnet"][2] / "meta.json").read_text())
    assert resnet_meta["pooling"] == "mean" and "img_size" not in resnet_meta["timm_kwargs"]


@pytest.mark.parametrize("run", ["clip", "supervised_resnet"])
def test_checkpoint_reloads_to_bitwise_identical_features(trained, run):
    _, result, run_dir = trained[run]
    loaded = load_zoo_model(run_dir, "cpu")
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        original = result.backbone.eval()(x)
        reloaded = loaded.backbone(x)
        assert torch.equal(original, reloaded)
        assert torch.equal(result.head.eval()(original), loaded.head(reloaded))


def test_checkpoint_keys_are_timms_plus_head(trained):
    """The contract: timm.create_model(timm_model, **timm_kwargs) loads the non-head keys strictly."""
    _, _, run_dir = trained["clip"]
    meta = json.loads((run_dir / "meta.json").read_text())
    tensors = load_file(str(run_dir / "model.safetensors"))
    model = timm.create_model(meta["timm_model"], **meta["timm_kwargs"])
    backbone = {k: v for k, v in tensors.items() if not k.startswith("head.")}
    model.load_state_dict(backbone, strict=True)
    assert sorted(k for k in tensors if k.startswith("head.")) == ["head.net.0.weight"]


def test_zoo_model_through_the_encoder_registry(trained):
    from repdiag.encoders import build_encoder

    _, result, run_dir = trained["supervised_resnet"]
    entry = {"source": "zoo", "id": "supervised_resnet", "family": "supervised"}
    encoder = build_encoder("supervised_resnet", entry, zoo_dir=run_dir.parent)
    images = np.random.default_rng(0).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    x = encoder.preprocess(images)
    outputs = encoder.layer_outputs(x)
    with torch.no_grad():
        expected = result.backbone.eval()(x)
    assert torch.allclose(outputs["final"], expected, atol=1e-6)
    assert "head" in outputs


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(EncoderError, match=r"meta\.json does not exist"):
        load_zoo_model(tmp_path / "nothing", "cpu")


def test_truncated_checkpoint_is_a_clear_error(trained, tmp_path):
    _, _, run_dir = trained["clip"]
    broken = tmp_path / "clip"
    broken.mkdir()
    (broken / "meta.json").write_bytes((run_dir / "meta.json").read_bytes())
    data = (run_dir / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(EncoderError, match=r"model\.safetensors is truncated or corrupt"):
        load_zoo_model(broken, "cpu")
    (broken / "model.safetensors").unlink()
    with pytest.raises(
        EncoderError, match=r"model\.safetensors does not exist: run the train_zoo rule"
    ):
        load_zoo_model(broken, "cpu")


def test_mismatched_architecture_is_a_clear_error(trained, tmp_path):
    _, _, run_dir = trained["clip"]
    other = tmp_path / "clip"
    other.mkdir()
    (other / "model.safetensors").write_bytes((run_dir / "model.safetensors").read_bytes())
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["timm_kwargs"]["depth"] = 3
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        EncoderError, match=r"does not hold the architecture .*meta\.json declares: blocks\.2\."
    ):
        load_zoo_model(other, "cpu")  # refused from the shapes, before the deeper network is built
    del meta["pooling"]
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(EncoderError, match=r"lacks \['pooling'\]"):
        load_zoo_model(other, "cpu")


def test_divergence_names_the_run_and_the_fix(tiny_spec):
    with pytest.raises(
        FloatingPointError, match=r"zoo run 'simclr'.*lower zoo\.objectives\.simclr\.lr"
    ):
        train(tiny_spec("simclr", lr=1e30, grad_clip=0.0, steps=4), "cpu")


def test_weights_of_another_run_are_refused_by_their_digest(trained, tmp_path):
    from safetensors.torch import save_file

    from repdiag.encoders.zoo.checkpoint import file_sha256

    _, _, run_dir = trained["supervised_resnet"]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["weights_sha256"] == file_sha256(run_dir / "model.safetensors")
    mixed = tmp_path / "supervised_resnet"
    mixed.mkdir()
    tensors = load_file(run_dir / "model.safetensors")
    first = next(name for name, t in tensors.items() if t.is_floating_point())
    tensors[first] = tensors[first] + 1.0  # same shapes, other values: another run's weights
    save_file(tensors, mixed / "model.safetensors", metadata={"format": "pt"})
    (mixed / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(EncoderError, match=r"SHA-256 differs.*rerun train_zoo"):
        load_zoo_model(mixed, "cpu")
    del meta["weights_sha256"]  # a run saved before digests were recorded still loads
    (mixed / "meta.json").write_text(json.dumps(meta))
    assert load_zoo_model(mixed, "cpu").meta["objective"] == "supervised"


@pytest.mark.parametrize("objective", ["supervised", "dino"])
def test_a_zero_step_run_is_the_random_initialised_network(tiny_spec, objective):
    """steps: 0 saves the backbone exactly as initialised (BatchNorm statistics and EMA teachers
    untouched) with the loss at step 0 as its one-point curve: the random-init control."""
    from repdiag.encoders.zoo.train import build_objective

    spec = tiny_spec(objective, steps=0)
    result = train(spec, "cpu")
    fresh, _ = build_objective(spec, "cpu")
    expected = fresh.export()[0].state_dict()
    for name, value in result.backbone.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert len(result.losses) == 1 and math.isfinite(result.losses[0])
    assert result.meta["steps"] == 0
    assert result.meta["initial_loss"] == result.meta["final_loss"] == result.losses[0]


def test_stop_at_is_the_full_runs_checkpoint_at_that_step(tiny_spec):
    """A run stopped at step k of an n-step schedule: the weights the n-step run has after k
    steps (the same learning rates), bit for bit, and its meta says how far it trained."""
    from repdiag.encoders.zoo.train import build_objective, make_optimizer, train_step

    spec = tiny_spec("supervised", steps=4, warmup_fraction=0.25)
    stopped = train({**spec, "stop_at": 2}, "cpu")
    objective, _ = build_objective(spec, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    losses = [float(train_step(objective, optimizer, spec, step, gen)) for step in range(2)]
    assert stopped.losses == losses
    expected = objective.export()[0].state_dict()
    for name, value in stopped.backbone.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert stopped.meta["steps"] == 4 and stopped.meta["steps_trained"] == 2
    # a 2-step run decays over 2 steps instead: other weights
    short = train({**spec, "steps": 2}, "cpu")
    assert short.losses[0] == losses[0]
    assert any(
        not torch.equal(value, short.backbone.state_dict()[name])
        for name, value in stopped.backbone.state_dict().items()
    )


def test_stop_at_zero_is_the_initialisation(tiny_spec):
    spec = tiny_spec("supervised", steps=4)
    start = train({**spec, "stop_at": 0}, "cpu")
    control = train({**spec, "steps": 0}, "cpu")
    for name, value in start.backbone.state_dict().items():
        assert torch.equal(value, control.backbone.state_dict()[name]), name
    assert start.meta["steps_trained"] == 0 and start.losses == control.losses


def test_arrangement_groups_change_the_batches_and_nothing_else(tiny_spec):
    """A grouped run is normalised like the plain run and starts from the same weights; it trains
    on other batches (so another loss) and records its grouping in meta.json."""
    from repdiag.encoders.zoo.train import build_objective

    spec = tiny_spec("supervised_resnet", steps=2)
    grouped = {**spec, "arrangement_groups": 4}
    plain_obj, grouped_obj = build_objective(spec, "cpu")[0], build_objective(grouped, "cpu")[0]
    assert (plain_obj.mean, plain_obj.std) == (grouped_obj.mean, grouped_obj.std)
    assert grouped_obj.scenes.arrangement_groups == 4 and plain_obj.scenes.arrangement_groups == 1
    for a, b in zip(
        plain_obj.state_dict().values(), grouped_obj.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    plain, run = train(spec, "cpu"), train(grouped, "cpu")
    assert run.losses != plain.losses
    assert run.meta["arrangement_groups"] == 4 and "arrangement_groups" not in plain.meta


def same_weights(a, b) -> bool:
    state_a, state_b = a.backbone.state_dict(), b.backbone.state_dict()
    heads = (a.head, b.head)
    same = all(torch.equal(state_a[k], state_b[k]) for k in state_a) and a.losses == b.losses
    if heads[0] is not None:
        head_a, head_b = heads[0].state_dict(), heads[1].state_dict()
        same = same and all(torch.equal(head_a[k], head_b[k]) for k in head_a)
    return same


@pytest.mark.parametrize("run", ["supervised_resnet", "simmim", "dino"])
def test_a_run_with_prefetch_has_the_weights_of_one_without_bit_for_bit(tiny_spec, run):
    """Batches rendered ahead in the worker are the bytes of in-loop rendering: same weights,
    same losses, at the same thread count; and the ConvNet's channels_last run repeats itself."""
    spec = tiny_spec(run, steps=3, batch_size=4)
    prefetched, again, in_loop = (
        train(spec, "cpu", prefetch=2),
        train(spec, "cpu", prefetch=2),
        train(spec, "cpu", prefetch=0),
    )
    assert same_weights(prefetched, in_loop) and same_weights(prefetched, again)
    assert all(t.is_contiguous() for t in prefetched.backbone.state_dict().values())


def test_the_losses_are_read_in_blocks_and_the_block_size_changes_nothing(tiny_spec, monkeypatch):
    from repdiag.encoders.zoo import train as train_module

    spec = tiny_spec("supervised_resnet", steps=5, batch_size=4)
    whole = train(spec, "cpu")
    reads = []
    read = train_module.LossLog.read

    def counted(self):
        reads.append(len(self.pending))
        read(self)

    monkeypatch.setattr(train_module, "READ_EVERY", 2)
    monkeypatch.setattr(train_module.LossLog, "read", counted)
    blocks = train(spec, "cpu")
    assert reads == [2, 2, 1] and blocks.losses == whole.losses
    assert all(isinstance(v, float) for v in blocks.losses)


def test_a_non_finite_loss_names_its_step():
    from repdiag.encoders.zoo.train import LossLog

    spec = {"run": "simclr", "objective": "simclr", "lr": 0.5}
    record = LossLog(spec)
    for value in (1.0, 2.0, float("nan"), float("inf")):
        record.add(torch.tensor(value))
    with pytest.raises(FloatingPointError, match=r"'simclr': the simclr loss is nan at step 2"):
        record.read()
    record = LossLog(spec)
    record.add(torch.tensor(1.0), [torch.tensor(3.0)])
    record.add(torch.tensor(1.0), [torch.tensor(float("inf"))])
    with pytest.raises(FloatingPointError, match=r"loss is inf at step 1"):
        record.read()
    record = LossLog(spec)
    record.add(torch.tensor(1.5), [torch.tensor(3.0)])
    record.read()
    assert (record.losses, record.estimates) == ([1.5], [3.0])
