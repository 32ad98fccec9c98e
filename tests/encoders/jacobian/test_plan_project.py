"""The plan of a config (repdiag.encoders.jacobian.plan_project): models left out of it, the
measured rate, a control that cannot run on the target device."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.jacobian import plan_project
from tests.encoders.jacobian.models import hub_and_control_config

torch.set_num_threads(1)


def test_an_unknown_hub_entry_without_its_checkout_is_not_planned():
    config = hub_and_control_config()
    plan = plan_project.plan_config(config, rate=1e12)
    assert [m.key for m in plan.models] == ["ctrl"]
    assert "needs its local checkout" in plan.skipped["odd"]
    mlp_plan = plan.models[0]
    assert mlp_plan.images == 3
    assert plan.total_flops == pytest.approx(
        3 * (mlp_plan.flops_per_image + mlp_plan.linalg_per_image)
    )
    assert plan.seconds == pytest.approx(plan.total_flops / 1e12)


def test_measured_rate_is_a_plausible_flop_rate():
    rate = plan_project.measure_rate(size=128, repeats=1, device="cpu")
    assert 1e6 < rate < 1e15


def test_a_control_that_mixes_devices_is_reported_for_cuda_and_counted_for_the_cpu(monkeypatch):
    """A control whose forward makes a tensor without the input's device fails on meta as it would
    on CUDA: the plan for CUDA reports it instead of counting it on the CPU."""
    import types

    from repdiag.binding import controls
    from repdiag.core.config import fill_defaults

    def arange(*args, device=None, **kwargs):
        return torch.arange(*args, **kwargs)  # the device dropped

    proxy = types.SimpleNamespace(**{name: getattr(torch, name) for name in dir(torch)})
    proxy.arange = arange
    entry = {"source": "python", "id": "repdiag.binding.controls:shape_oracle", "family": "control"}
    config = fill_defaults({"datasets": {}, "models": {"oracle": entry}})
    clean = plan_project.plan_config(config, rate=1e12, device="cuda")
    assert [m.key for m in clean.models] == ["oracle"] and not clean.skipped
    monkeypatch.setattr(controls, "torch", proxy)
    on_cuda = plan_project.plan_config(config, rate=1e12, device="cuda")
    assert not on_cuda.models
    assert "cannot run on cuda, a tensor stays on the CPU" in on_cuda.skipped["oracle"]
    assert "models.oracle" in on_cuda.skipped["oracle"]
    on_cpu = plan_project.plan_config(config, rate=1e12, device="cpu")
    assert [m.kind for m in on_cpu.models] == [f"{clean.models[0].kind} (counted on CPU)"]
