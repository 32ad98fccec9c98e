"""The dose series' section of the summary: unit, n and the parametric p beside every interval,
the exact and permutation p beside the t p, a Monte Carlo p at its floor printed ``< 1/B``
(repdiag.binding.dose_report)."""

from __future__ import annotations

import numpy as np

from repdiag.binding.dose import UNIT, dose_correlations, dose_series, final_runs
from repdiag.binding.dose_report import dose_markdown
from repdiag.common.exact import permutation_correlation_p
from tests.binding.test_dose import OPTIONS, series_table


def test_summary_section_states_unit_n_and_p_beside_every_interval():
    table = series_table()
    text = "\n".join(
        dose_markdown(table, dose_correlations(table, OPTIONS), "binding_cosine", 0.95)
    )
    assert "12 training runs at 4 doses and 3 seeds" in text
    assert f"unit: {UNIT}; n = 12 runs, 3 seeds as blocks" in text
    jer_line = next(line for line in text.splitlines() if line.startswith("| jer |"))
    assert jer_line.count("], p = ") == 4  # slope, standardised, r, fixed effects
    assert "| sign-flip p (exact) |" in text and "seed fixed effects slope, t p (df)" in text
    assert "| 0.25 |" in jer_line and jer_line.endswith("(df 8) |")
    assert "Wald" not in text and "mixed" not in text
    # 3 seeds x 4 doses: 24^3 = 13824 blocked permutations, enumerated: p = 1 / 13824
    assert "| 7.2e-05 |" in jer_line
    assert "| jer - g_iso |" in text
    assert "| lambda=1/seed=0 | 0 | random_resnet |" in text
    empty = dose_markdown(table.assign(dose=np.nan), dose_correlations(table, OPTIONS), "b", 0.95)
    assert any("No dose series" in line for line in empty)


def test_summary_prints_a_monte_carlo_permutation_p_at_its_floor_as_below_one_over_b():
    table = series_table()
    frame = dose_correlations(table, OPTIONS)
    jer = frame.index[frame["metric"] == "jer"][0]
    # as five seeds would give: 24^5 permutations, 19999 drawn, none as extreme as observed
    frame.loc[jer, ["permutation_p_greater", "n_permutations"]] = [1 / 20000, 19999]
    frame.loc[jer, "permutation_exact"] = False
    text = "\n".join(dose_markdown(table, frame, "binding_cosine", 0.95))
    jer_line = next(line for line in text.splitlines() if line.startswith("| jer |"))
    assert "| < 5e-05 |" in jer_line


def test_the_permutation_p_of_r_sits_beside_its_t_p_up_to_ten_runs():
    table = series_table()
    frame = dose_correlations(table, OPTIONS)
    columns = frame.columns.tolist()
    assert columns[columns.index("pearson_p") + 1] == "pearson_p_exact"
    slopes = frame[frame["analysis"] == "slope on binding"]
    assert slopes["pearson_p_exact"].isna().all()  # 12 runs: the t p stands alone
    text = "\n".join(dose_markdown(table, frame, "binding_cosine", 0.95))
    assert "; permutation p = " not in text
    # two seeds: 8 runs, every one of the 8! orders of the metric enumerated
    small = table[table["seed"] != 2.0].reset_index(drop=True)
    frame = dose_correlations(small, OPTIONS)
    jer = frame[(frame["analysis"] == "slope on binding") & (frame["metric"] == "jer")].iloc[0]
    finals = final_runs(dose_series(small))
    assert len(finals) == 8
    expected = permutation_correlation_p(finals["binding"], finals["jer"])
    assert jer["pearson_p_exact"] == expected and expected >= 2 / 40320
    text = "\n".join(dose_markdown(small, frame, "binding_cosine", 0.95))
    jer_line = next(line for line in text.splitlines() if line.startswith("| jer |"))
    assert f"; permutation p = {expected:.2g} |" in jer_line
