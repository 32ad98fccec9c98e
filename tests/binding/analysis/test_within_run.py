"""The within-run split of the family comparison (repdiag.binding.analysis.within_run): runs seen
at a saved step and at their end, their changes regressed on each other, units compared apart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repdiag.binding.analysis.within_run import run_changes, run_steps, within_run_table
from repdiag.common.exact import PERMUTATION_DRAWS

from .test_units import meta, row

B_WITHIN, SHARED, B_BETWEEN = -0.2, 0.05, 0.1


def runs_table(noise: float = 0.0, saved: bool = True) -> pd.DataFrame:
    """5 objectives x 3 seeds, each run at step 1000 (saved) and 3000 (its end): the score moves
    with the metric inside a run at B_WITHIN, plus SHARED for every run; the objectives' levels
    lie on a line of slope B_BETWEEN."""
    rng = np.random.default_rng(5)
    rows = []
    for unit in range(5):
        for seed in range(3):
            run = meta(f"objective{unit}", seed, steps=3000)
            start = unit + 0.3 * seed
            change = rng.normal(0.0, 1.0)
            level = 0.5 + B_BETWEEN * unit
            early = {"jer": start, "binding": level}
            late = {"jer": start + change,
                    "binding": level + SHARED + B_WITHIN * change + noise * rng.normal()}  # fmt: skip
            name = f"objective{unit}_s{seed}"
            rows.append(row(name, "contrastive", run, **late))
            if saved:
                rows.append(row(f"{name}_step1000", "contrastive", run, step=1000, **early))
    return pd.DataFrame(rows)


def test_a_runs_change_recovers_the_within_slope_and_the_shared_change():
    table = within_run_table(runs_table(), ["jer"], confidence=0.95, seed=0)
    (got,) = table.to_dict("records")
    assert (got["n_runs"], got["n_units"]) == (15, 5)
    assert (got["first_step"], got["last_step"]) == (1000, 3000)
    assert got["within"] == pytest.approx(B_WITHIN, abs=1e-12)
    assert got["shared_change"] == pytest.approx(SHARED, abs=1e-12)
    assert got["within_permutation_p"] == pytest.approx(1 / (1 + PERMUTATION_DRAWS))  # the floor
    assert got["note"] == ""


def test_the_between_slope_is_the_line_through_the_units_means():
    frame = runs_table(noise=0.02)
    (got,) = within_run_table(frame, ["jer"], confidence=0.9, seed=0).to_dict("records")
    frame["unit"] = frame["model"].str.extract(r"(objective\d)")[0]
    means = frame.groupby("unit")[["jer", "binding"]].mean()
    slope, _ = np.polyfit(means["jer"], means["binding"], 1)
    assert got["between"] == pytest.approx(slope, rel=1e-10)
    assert got["between_low"] < slope < got["between_high"]
    # and the within slope is that of the runs' changes, with an interval that covers the truth
    changes = run_changes(run_steps(frame), "jer")
    within, shared = np.polyfit(changes["dx"], changes["dy"], 1)
    assert (got["within"], got["shared_change"]) == pytest.approx((within, shared), rel=1e-10)
    assert got["within_low"] < B_WITHIN < got["within_high"]


def test_without_saved_steps_there_is_no_within_slope_and_it_says_so():
    (got,) = within_run_table(runs_table(saved=False), ["jer"], 0.95, 0).to_dict("records")
    assert got["n_runs"] == 0 and np.isnan(got["within"])
    assert "0 runs with a saved step" in got["note"]
    assert np.isfinite(got["between"])  # the final networks still compare across units


def test_controls_and_metrics_the_table_lacks_are_left_out():
    frame = runs_table()
    control = row("random", "control", meta("random", 0), jer=100.0, binding=0.0)
    frame = pd.concat([frame, pd.DataFrame([control])], ignore_index=True)
    table = within_run_table(frame, ["jer", "g_pr"], 0.95, 0)
    assert table["metric"].tolist() == ["jer"]
    assert table.loc[0, "within"] == pytest.approx(B_WITHIN, abs=1e-12)
