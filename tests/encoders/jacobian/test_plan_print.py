"""The planner's printout (repdiag.encoders.jacobian.plan_print): units and the plan as text."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.jacobian import plan_print
from repdiag.encoders.jacobian.plan_project import plan_config
from tests.encoders.jacobian.models import hub_and_control_config

torch.set_num_threads(1)


def test_human_units():
    assert plan_print.human_flops(4.2e15) == "4.2 PFLOP"
    assert plan_print.human_bytes(1.5 * 2**30) == "1.5 GiB"
    assert plan_print.human_bytes(1000 * 2**20) == "0.977 GiB"
    assert plan_print.human_seconds(6480) == "1.80 h"
    assert plan_print.human_seconds(780) == "13.0 min"
    assert plan_print.human_seconds(3 * 86400) == "3.0 d"


def test_the_printed_plan_lists_what_was_left_out_and_the_totals():
    plan = plan_config(hub_and_control_config(), rate=1e12)
    text = plan_print.format_plan(plan)
    assert "not planned: odd:" in text and "excluded from the totals" in text
    assert "grand total: 1 models x 3 probe images" in text
    assert "ctrl: python repdiag.binding.controls:random_features" in text


@pytest.mark.parametrize("rate", ["nan", "-1", "0", "inf", "fast"])
def test_plan_refuses_a_rate_that_is_not_positive_and_finite(rate, capsys):
    from repdiag.encoders.jacobian.plan_print import command, positive_rate

    with pytest.raises(SystemExit) as exit_info:
        command(["config/test.yaml", "--rate", rate])
    assert exit_info.value.code == 2
    assert f"--rate: {rate!r} is not a positive finite FLOP rate" in capsys.readouterr().err
    assert positive_rate("67e12") == 67e12
