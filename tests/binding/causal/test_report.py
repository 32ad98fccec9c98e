"""The JER intervention's summary and figure: unit and n in every table, t and exact p and
Holm's level beside every primary interval, the floor, the displacement and the pilot shown."""

from __future__ import annotations

import pandas as pd

from repdiag.binding.causal.analysis import (
    binding_per_jer,
    causal_contrasts,
    displacement_summary,
    plain_associations,
)
from repdiag.binding.causal.report import (
    causal_figure,
    causal_markdown,
    family_table,
    interval_text,
    manipulation_matrix,
)
from tests.binding.causal.test_analysis import SEEDS, arms_frame

CALIBRATION = pd.DataFrame(
    [
        {
            "run": "causal_0p3_raise_s0",
            "term": term,
            "n_steps": 13,
            "share_per_unit_weight_median": median,
            "share_per_unit_weight_p10": median / 2,
            "share_per_unit_weight_p90": median * 2,
            "target": 0.5,
            "weight_for_target": 0.5 / median,
        }
        for term, median in (("jer", 1480.0), ("global_pr", 1.05))
    ]
)


def report_inputs():
    arms = arms_frame()
    arms["weight"] = 0.0
    contrasts = causal_contrasts(arms, 0.95)
    return (
        arms,
        contrasts,
        displacement_summary(arms, 0.95),
        binding_per_jer(arms, n_boot=200, seed=0, confidence=0.95),
        plain_associations(arms, 0.95, 200, 0),
    )


def test_interval_text_is_the_mean_and_its_t_interval() -> None:
    row = pd.Series({"mean": 0.0125, "ci_low": -0.01, "ci_high": 0.035})
    assert interval_text(row) == "0.013 [-0.010, 0.035]"
    assert interval_text(pd.Series({"mean": float("nan"), "ci_low": 0, "ci_high": 0})) == "n/a"


def test_the_primary_family_table_states_n_both_p_holm_and_the_verdict() -> None:
    _, contrasts, *_ = report_inputs()
    table = family_table(contrasts, "primary")
    assert len(table) == 8
    assert list(table.columns)[-2:] == ["p (Holm, 8 tests)", "at 0.05 (Holm)"]
    raised = table[(table["contrast"] == "raise − plain") & (table["metric"] == "binding")].iloc[0]
    assert raised["n (seeds)"] == len(SEEDS)
    # six seeds all positive: exact p at its floor 2/64 = 0.031, times 8 in Holm: not below 0.05
    assert raised["p (exact sign-flip)"] == "0.031" and raised["at 0.05 (Holm)"] == "cannot tell"
    floor = family_table(contrasts, "floor")
    assert "p (Holm, 8 tests)" not in floor.columns and set(floor["contrast"]) == {"null − plain"}


def test_the_manipulation_matrix_has_an_arm_per_row_and_a_metric_per_column() -> None:
    _, contrasts, *_ = report_inputs()
    matrix = manipulation_matrix(contrasts).set_index("arm − plain")
    assert list(matrix.index) == ["null", "raise", "lower", "sham", "geometry"]
    assert {"JER (top-k)", "G.PR", "L.Iso (k=10)", "presence loss (held out)"} <= set(
        matrix.columns
    )
    assert matrix.loc["raise", "JER (top-k)"].startswith("2 [2, 2]")


def test_summary_has_every_section_with_unit_and_n() -> None:
    arms, contrasts, moved, per_jer, associations = report_inputs()
    text = causal_markdown(
        arms, contrasts, CALIBRATION, moved, per_jer, associations, readout="cosine"
    )
    for title in (
        "## Calibration pilot",
        "## Primary family",
        "## Secondary family",
        "## The floor: null against plain",
        "## Displacement from plain",
        "## Manipulation matrix",
        "## Interventional against observational",
        "## Runs",
    ):
        assert title in text, title
    assert "training run (seed)" in text and "intention to treat" in text
    assert "1480 [740, 2960]" in text  # the pilot's share per unit weight
    assert f"n = {len(SEEDS)}" in text
    empty = causal_markdown(
        arms.iloc[0:0], contrasts, None, moved, per_jer, associations, readout="cosine"
    )
    assert "No causal bases" in empty


def test_figure_has_its_three_panels() -> None:
    arms, contrasts, *_ = report_inputs()
    figure = causal_figure(arms, contrasts, chance=0.125)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "binding per arm (grey lines: seeds)"
    assert "against plain" in titles[1] and "manipulation" in titles[2]
    labels = [t.get_text() for t in figure.axes[1].get_xticklabels()]
    assert labels == ["raise", "lower", "sham", "geometry", "null"]
    assert figure.axes[2].get_ylabel() == "arm − plain, in SDs of the plain runs"
    empty = causal_figure(arms.iloc[0:0], contrasts.iloc[0:0], chance=None)
    assert len(empty.axes) == 3
