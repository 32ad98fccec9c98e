"""The intervention terms (repdiag.encoders.zoo.regulariser): the direction sham is seeded,
orthogonal to both gradients and norm-matched; weight 0 is the plain run for every term; the
push's share of the AdamW step against an independent computation of AdamW's step; G.PR and its
gradient against the workflow's G.PR and finite differences; the cumulative push and the
displacement along it against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.encoders.zoo.regulariser import (
    Regulariser,
    RegulariserSettings,
    adam_update,
    clip_coefficient,
    global_pr,
    jer_penalty,
    orthogonal_push,
    probe_generator,
    sham_direction,
    update_share,
)
from repdiag.encoders.zoo.train import train

pytestmark = pytest.mark.xdist_group("encoders/zoo/test_regulariser")


def tiny_batch(objective, n=8):
    from repdiag.encoders.zoo.scenes import scene_batch
    from repdiag.encoders.zoo.stream import to_batch

    return to_batch(scene_batch(objective.scenes, 1, 0, n), "cpu")


def same_backbone(a, b) -> bool:
    state_a, state_b = a.backbone.state_dict(), b.backbone.state_dict()
    return all(torch.equal(state_a[k], state_b[k]) for k in state_a)


# --------------------------------------------------------------------------- settings


def test_settings_default_to_jer_and_refuse_an_unknown_term():
    assert RegulariserSettings.of({"run": "r"}).weight == 0.0
    assert RegulariserSettings.of({"jer_regulariser": {"weight": 0.5}}).term == "jer"
    with pytest.raises(ValueError, match=r"jer_regulariser.term 'random_sign' is not one of"):
        RegulariserSettings.of({"run": "r", "jer_regulariser": {"term": "random_sign"}})


def test_start_fraction_sets_the_first_step_the_term_acts():
    settings = RegulariserSettings.from_config({"weight": 0.5, "start_fraction": 0.5})
    assert [settings.acts(step, 4) for step in range(4)] == [False, False, True, True]
    assert not RegulariserSettings.from_config({}).acts(3, 4)  # the schema's weight: 0, off


def test_a_runs_regulariser_takes_the_schema_defaults_and_names_the_run_on_a_stray_key():
    assert RegulariserSettings.of({"run": "r"}) == RegulariserSettings(
        weight=0.0, images=4, probes=2, term="jer", start_fraction=0.0
    )
    with pytest.raises(
        ValueError, match=r"zoo run 'r': unknown key zoo\.objectives\.r\.jer_regulariser\.wieght"
    ):
        RegulariserSettings.of({"run": "r", "jer_regulariser": {"wieght": 1.0}})


@pytest.mark.parametrize("term", ["jer", "global_pr", "direction_sham"])
def test_weight_0_is_the_plain_run_bit_for_bit_for_every_term(tiny_spec, term):
    spec = tiny_spec("supervised_resnet", steps=3)
    plain = train(spec, "cpu")
    off = train({**spec, "jer_regulariser": {"weight": 0.0, "term": term, "images": 2}}, "cpu")
    assert off.losses == plain.losses and "jer_regulariser" not in off.meta
    assert same_backbone(plain, off) and off.push is None


def test_start_fraction_leaves_the_first_steps_as_the_plain_runs(tiny_spec):
    """start_fraction 0.5 of 4 steps: the losses up to step 2's (taken before its update) are the
    plain run's; the updates from step 2 on carry the term."""
    spec = tiny_spec("supervised_resnet", steps=4)
    late = {**spec, "jer_regulariser": {"weight": 0.5, "images": 2, "start_fraction": 0.5}}
    plain, run = train(spec, "cpu"), train(late, "cpu")
    assert run.losses[:3] == plain.losses[:3] and run.losses[3] != plain.losses[3]
    assert run.meta["jer_regulariser"]["steps_acted"] == 2


# --------------------------------------------------------------------------- the direction sham


def test_the_sham_direction_is_seeded_and_its_own_stream():
    shapes = [torch.empty(3, 4), torch.empty(5)]
    first, again, other = (
        sham_direction(shapes, 3),
        sham_direction(shapes, 3),
        sham_direction(shapes, 4),
    )
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    sham_direction(shapes, 3)  # draws from its own generator, not the global one
    assert torch.equal(torch.rand(1), before)


def test_orthogonal_push_closed_form():
    """In R^3 with the two gradients spanning the first two axes, what is left of r is its third
    coordinate, scaled to the size asked for."""
    r = torch.tensor([1.0, 2.0, -3.0])
    a, b = torch.tensor([2.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    assert torch.allclose(orthogonal_push(r, a, b, 2.0), torch.tensor([0.0, 0.0, -2.0]))
    # nothing left once the gradients span the space: no push
    plane = orthogonal_push(torch.tensor([1.0, 2.0]), torch.eye(2)[0], torch.eye(2)[1], 1.0)
    assert torch.equal(plane, torch.zeros(2))


def test_the_sham_push_is_orthogonal_to_both_gradients_and_norm_matched_per_tensor(tiny_spec):
    """On a real step of a tiny run: per backbone tensor, the sham's push is orthogonal to the
    PR2 term's and the objective's gradient, its norm is |w| ||grad PR2|| of that tensor (the
    raise arm's push), and it stays close to the fixed direction (so it accumulates)."""
    from repdiag.encoders.zoo.train import build_objective

    spec = tiny_spec("supervised_resnet", steps=2)
    sham_spec = {**spec, "jer_regulariser": {"weight": 0.3, "term": "direction_sham", "images": 2}}
    objective, _ = build_objective(sham_spec, "cpu")
    objective.train()
    regulariser = Regulariser(sham_spec, objective.backbone)
    batch = tiny_batch(objective)
    loss = objective.loss(batch, torch.Generator().manual_seed(0))
    value = jer_penalty(objective, batch, regulariser.settings, probe_generator(0, 0))
    g_obj = torch.autograd.grad(loss, regulariser.params, allow_unused=True)
    g_jer = torch.autograd.grad(value, regulariser.params, allow_unused=True)
    push = regulariser.push(g_jer, g_obj)
    raise_push = Regulariser(
        {**sham_spec, "jer_regulariser": {"weight": 0.3, "images": 2}}, objective.backbone
    ).push(g_jer, g_obj)
    checked = 0
    for d, gj, go, r, up in zip(push, g_jer, g_obj, regulariser.direction, raise_push, strict=True):
        if gj is None or d.numel() < 3 or float(gj.norm()) == 0.0:
            assert float(d.norm()) == 0.0  # no PR2 gradient on the tensor: no push, as raise
            continue
        scale = float(d.double().norm()) * max(float(gj.double().norm()), 1e-30)
        assert abs(float((d.double() * gj.double()).sum())) <= 1e-6 * scale
        if go is not None:
            scale_o = float(d.double().norm()) * max(float(go.double().norm()), 1e-30)
            assert abs(float((d.double() * go.double()).sum())) <= 1e-6 * scale_o
        assert float(d.double().norm()) == pytest.approx(float(up.double().norm()), rel=1e-5)
        cosine = float((d.double() * r.double()).sum() / d.double().norm() / r.double().norm())
        if d.numel() >= 100:
            assert cosine > 0.9  # two directions removed from a random one in >= 100 dimensions
        checked += 1
    assert checked >= 5


# --------------------------------------------------------------------------- AdamW's step


def tiny_adamw(state_steps: int, weight_decay: float = 0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=weight_decay)
    for _ in range(state_steps):
        model.zero_grad()
        model(torch.randn(8, 4)).square().sum().backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("state_steps", [0, 3])
def test_adam_update_is_the_step_adamw_takes(state_steps):
    """Independent computation: the parameter change torch's AdamW makes, with its decoupled
    weight decay removed, theta_before (1 - lr wd) - theta_after, is the u adam_update predicts
    from the state before the step."""
    model, optimizer = tiny_adamw(state_steps)
    model.zero_grad()
    model(torch.randn(8, 4)).square().sum().backward()
    before = [p.detach().clone().double() for p in model.parameters()]
    predicted = [adam_update(optimizer, p, p.grad)[0] for p in model.parameters()]
    optimizer.step()
    for p, b, u in zip(model.parameters(), before, predicted, strict=True):
        actual = b * (1 - 0.01 * 0.1) - p.detach().double()
        assert torch.allclose(actual, u, rtol=1e-5, atol=1e-9)


def test_update_share_closed_forms():
    """From a fresh state AdamW's first step is lr g / (|g| + eps): a push equal to the
    gradient is as large as the step (share 1), twice the gradient twice as large; a push on
    coordinates the objective does not move is divided by eps-sized denominators no more than
    the objective's is."""
    model, optimizer = tiny_adamw(0)
    params = list(model.parameters())
    grads = [torch.randn_like(p) for p in params]
    assert update_share(optimizer, params, grads, grads) == pytest.approx(1.0, rel=1e-6)
    assert update_share(optimizer, params, grads, [2 * g for g in grads]) == pytest.approx(
        2.0, rel=1e-6
    )
    # the clip coefficient scales push and step alike
    assert update_share(optimizer, params, grads, grads, 0.25) == pytest.approx(1.0, rel=1e-6)
    assert update_share(optimizer, params, grads, [None] * len(params)) == 0.0


def test_clip_coefficient_is_torchs():
    grads = [torch.full((3,), 2.0), torch.full((4,), -1.0)]
    norm = math.sqrt(3 * 4 + 4)
    assert clip_coefficient(grads, 1.0) == pytest.approx(1.0 / (norm + 1e-6))
    assert clip_coefficient(grads, 100.0) == 1.0 and clip_coefficient(grads, 0.0) == 1.0
    tensors = [g.clone().requires_grad_() for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(tensors, 1.0)
    assert torch.allclose(tensors[0].grad, grads[0] * clip_coefficient(grads, 1.0))


def test_the_cumulative_push_of_one_step_is_lr_c_d_over_adams_denominator(tiny_spec):
    """A 1-step raise run: P = -lr_0 c d / (sqrt(v_hat_1) + eps) with d = -w grad PR2, computed
    here from the same gradients on a fresh copy, and meta.json's push_norm is ||P||."""
    from repdiag.encoders.zoo.train import (
        build_objective,
        learning_rate,
        make_optimizer,
        train_step,
    )

    spec = tiny_spec("supervised_resnet", steps=1, grad_clip=0.0)
    raised = {**spec, "jer_regulariser": {"weight": 0.5, "images": 2, "probes": 2}}
    objective, _ = build_objective(raised, "cpu")
    objective.train()
    optimizer = make_optimizer(objective, raised)
    regulariser = Regulariser(raised, objective.backbone)
    gen = torch.Generator().manual_seed(raised["seed"])
    train_step(objective, optimizer, raised, 0, gen, regulariser=regulariser)
    lr = learning_rate(0, 1, raised["lr"], raised["warmup_fraction"])
    # independent: a fresh copy's gradients, AdamW's first-step v_hat = g_total^2
    fresh, _ = build_objective(raised, "cpu")
    fresh.train()
    from repdiag.encoders.zoo.scenes import scene_batch
    from repdiag.encoders.zoo.stream import to_batch

    batch = to_batch(
        scene_batch(fresh.scenes, raised["scenes"]["seed"], 0, raised["batch_size"]), "cpu"
    )
    loss = fresh.loss(batch, torch.Generator().manual_seed(raised["seed"]))
    params = [p for p in fresh.backbone.parameters() if p.requires_grad]
    value = jer_penalty(
        fresh,
        batch,
        RegulariserSettings(weight=0.5, images=2, probes=2),
        probe_generator(raised["seed"], 0),
    )
    g_obj = torch.autograd.grad(loss, params, allow_unused=True)
    g_jer = torch.autograd.grad(value, params, allow_unused=True)
    for k, p in enumerate(params):
        d = -0.5 * (g_jer[k] if g_jer[k] is not None else torch.zeros_like(p)).double()
        total = (g_obj[k] if g_obj[k] is not None else torch.zeros_like(p)).double() + d
        expected = -lr * d / (total.abs() + 1e-8)
        assert torch.allclose(regulariser.cumulative[k], expected, rtol=1e-3, atol=1e-10)
    record = regulariser.record()
    norm = math.sqrt(sum(float(c.square().sum()) for c in regulariser.cumulative))
    assert record["push_norm"] == pytest.approx(norm) and record["steps_acted"] == 1


def test_a_regularised_run_returns_its_push_and_records_what_it_did(tiny_spec):
    spec = tiny_spec("supervised_resnet", steps=3)
    result = train({**spec, "jer_regulariser": {"weight": 0.5, "term": "global_pr"}}, "cpu")
    names = {n for n, p in result.backbone.named_parameters() if p.requires_grad}
    assert set(result.push) == names
    record = result.meta["jer_regulariser"]
    assert record["steps_acted"] == 3 and record["term"] == "global_pr"
    norm = math.sqrt(sum(float(v.double().square().sum()) for v in result.push.values()))
    assert record["push_norm"] == pytest.approx(norm, rel=1e-6)
    assert (
        0
        < record["update_share_p10"]
        <= record["update_share_median"]
        <= record["update_share_p90"]
    )


def test_a_null_push_changes_the_run_by_little_at_first(tiny_spec):
    """weight 1e-9: not the plain run (the push is there), but its first steps' weights within
    a hair of it; over a long run chaos takes it further (the null arm's floor)."""
    spec = tiny_spec("supervised_resnet", steps=2)
    plain = train(spec, "cpu")
    null = train({**spec, "jer_regulariser": {"weight": 1e-9, "term": "global_pr"}}, "cpu")
    a, b = plain.backbone.state_dict(), null.backbone.state_dict()
    distance = math.sqrt(sum(float((a[k].double() - b[k].double()).square().sum()) for k in a))
    assert 0 < distance < 1e-5


# --------------------------------------------------------------------------- G.PR


def test_global_pr_is_the_workflows_g_pr():
    from repdiag.binding.metrics.geometry import global_participation_ratio

    rng = np.random.default_rng(0)
    for n, d in ((64, 16), (12, 40)):
        x = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=d)
        assert float(global_pr(torch.from_numpy(x))) == pytest.approx(
            global_participation_ratio(x), rel=1e-9
        )
    assert float(global_pr(torch.ones(5, 3, dtype=torch.float64))) == 0.0  # a collapsed set


def test_global_pr_gradient_against_finite_differences():
    x = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(global_pr, (x,), eps=1e-6, atol=1e-7)


def test_the_geometry_term_raises_g_pr_to_first_order(tiny_spec):
    from repdiag.encoders.zoo.regulariser import global_pr_penalty
    from repdiag.encoders.zoo.train import build_objective

    objective, _ = build_objective(tiny_spec("supervised_resnet"), "cpu")
    batch = tiny_batch(objective)
    params = [p for p in objective.backbone.parameters() if p.requires_grad]
    start = global_pr_penalty(objective, batch)
    grads = torch.autograd.grad(start, params, allow_unused=True)
    start = start.detach()
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p.add_(1e-3 * g / max(float(g.norm()), 1e-12))
    assert float(global_pr_penalty(objective, batch)) > float(start)
