"""The JER intervention's summary and figure: unit and n in every table, p beside every
interval, the runs left out named, the calibration pilot shown."""

from __future__ import annotations

import pandas as pd

from repdiag.binding.causal import causal_contrasts, screen_losses
from repdiag.binding.causal_report import causal_figure, causal_markdown, interval_text
from tests.binding.test_causal import arms_frame

CALIBRATION = pd.DataFrame(
    [
        {
            "run": "causal_1_raise_s0",
            "n_steps": 13,
            "weight": 0.0016,
            "ratio_median": 0.2,
            "ratio_min": 0.13,
            "ratio_max": 0.25,
            "share_in_range": 1.0,
            "weight_for_target": 0.0016,
            "target": 0.2,
        }
    ]
)


def report_inputs() -> tuple[pd.DataFrame, pd.DataFrame]:
    arms = screen_losses(arms_frame(), 2.0)
    for column in ("steps_up", "steps_down"):
        arms[column] = 0
    return arms, causal_contrasts(arms, 0.95)


def test_interval_text_puts_the_p_beside_the_interval() -> None:
    row = pd.Series({"mean": 0.0125, "ci_low": -0.01, "ci_high": 0.035, "p": 0.21})
    assert interval_text(row) == "0.013 [-0.010, 0.035], p = 0.21"
    assert interval_text(pd.Series({"mean": float("nan"), "ci_low": 0, "ci_high": 0, "p": 0})) == (
        "n/a"
    )


def test_summary_states_unit_n_p_and_the_runs_left_out() -> None:
    arms, contrasts = report_inputs()
    text = causal_markdown(arms, contrasts, CALIBRATION, spread_sd=2.0, readout="cosine")
    for title in (
        "## Calibration pilot",
        "## Runs",
        "## Primary estimate: each arm against the sham",
        "## Effects against plain",
        "## Manipulation check",
    ):
        assert title in text
    assert "Left out by the loss screen: causal_1_lower_s3." in text
    assert "| causal_1 | binding | raise − sham | training run (seed) | 4 |" in text
    assert "| causal_1 | binding | lower − sham | training run (seed) | 3 |" in text
    assert "0.200 [0.130, 0.250]" in text  # the pilot's ratio at |w|
    primary = text.split("## Primary estimate")[1].split("## Effects against plain")[0]
    assert primary.count(", p = ") == 6  # binding and Same/Different for raise, lower, plain
    assert "No causal bases" in causal_markdown(
        arms.iloc[0:0], contrasts, None, spread_sd=2.0, readout="cosine"
    )


def test_figure_has_its_three_panels() -> None:
    arms, contrasts = report_inputs()
    figure = causal_figure(arms, contrasts, chance=0.125)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "binding per arm (lines: seeds)"
    assert "against the sham" in titles[1] and "against plain" in titles[2]
    assert len(figure.axes[1].get_xticklabels()) == 6  # 2 metrics x (raise, lower, plain)
    empty = causal_figure(arms.iloc[0:0], contrasts.iloc[0:0], chance=None)
    assert len(empty.axes) == 3
