"""The binding dose series: which models belong to it, and its correlations against an
independent computation (repdiag.binding.dose)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.dose import SERIES, dose_correlations, dose_figure, dose_markdown, dose_series

OPTIONS = {"n_boot": 400, "seed": 0, "confidence": 0.95, "min_models": 4}


def series_table() -> pd.DataFrame:
    """Six dose models whose JER rises with binding, a geometry metric that does not, and two
    models outside the series (NaN dose: another objective, a control)."""
    dose = [0.0, 0.0, 0.1, 0.1, 1.0, 1.0, np.nan, np.nan]
    binding = [0.12, 0.14, 0.35, 0.30, 0.85, 0.80, 0.9, 0.12]
    return pd.DataFrame(
        {
            "model": [f"m{i}" for i in range(8)],
            "dose": dose,
            "seed": [0, 1, 1, 0, 0, 1, 0, 0],
            "step": [300.0] * 8,
            "binding": binding,
            "binding_cosine": binding,
            "binding_cosine_ci_low": np.array(binding) - 0.03,
            "binding_cosine_ci_high": np.array(binding) + 0.03,
            "jer": [5.0, 5.5, 7.0, 6.5, 9.0, 9.5, 1.0, 30.0],
            "g_pr": [0.3, 0.1, 0.2, 0.4, 0.1, 0.3, 0.5, 0.5],
            "g_iso": [1.0, 2.0, 1.5, 1.0, 2.0, 1.5, 0.0, 0.0],
            "l_iso_k5": [0.5, 0.6, 0.5, 0.6, 0.5, 0.6, 0.1, 0.1],
            "same_different": [0.5, 0.52, 0.6, 0.58, 0.9, 0.88, 0.5, 0.5],
        }
    )


def test_the_series_is_every_model_with_a_dose_in_dose_seed_order():
    series = dose_series(series_table())
    assert series["model"].tolist() == ["m0", "m1", "m3", "m2", "m4", "m5"]
    assert dose_series(series_table().drop(columns="dose")).empty


def test_correlations_within_the_series_match_scipy():
    table = series_table()
    frame = dose_correlations(table, OPTIONS).set_index("metric")
    assert frame.index.tolist() == ["jer", "g_pr", "g_iso", "l_iso_k5", "same_different"]
    assert set(frame["models"]) == {SERIES}
    inside = table.iloc[:6]
    for metric in frame.index:
        r, _ = sps.pearsonr(inside[metric], inside["binding"])
        rho, _ = sps.spearmanr(inside[metric], inside["binding"])
        assert frame.loc[metric, "pearson_r"] == pytest.approx(r, abs=1e-12), metric
        assert frame.loc[metric, "spearman_rho"] == pytest.approx(rho, abs=1e-12), metric
        assert frame.loc[metric, "n"] == 6
    jer = frame.loc["jer"]
    assert jer["pearson_ci_low"] <= jer["pearson_r"] <= jer["pearson_ci_high"]
    assert jer["pearson_ci_low"] > 0.8  # JER rises with binding here by construction
    assert frame["n_doses"].iloc[0] == 3
    assert frame["binding_min"].iloc[0] == 0.12 and frame["binding_max"].iloc[0] == 0.85
    assert frame["dose_min"].iloc[0] == 0.0 and frame["dose_max"].iloc[0] == 1.0


def test_no_series_gives_a_table_with_a_note_not_numbers():
    frame = dose_correlations(series_table().assign(dose=np.nan), OPTIONS)
    assert (frame["n"] == 0).all() and frame["pearson_r"].isna().all()
    assert frame["note"].str.contains("no dose series").all()


def test_summary_section_lists_the_models_and_the_correlations():
    table = series_table()
    lines = dose_markdown(table, dose_correlations(table, OPTIONS), "binding_cosine", 0.95)
    text = "\n".join(lines)
    assert "6 models at 3 doses" in text and "Binding spans 0.120 to 0.850" in text
    assert "| m4 | 1 | 0 | 300 | 0.850 [0.82, 0.88] | 9.00 |" in text
    assert "| jer | 6 |" in text
    empty = dose_markdown(table.assign(dose=np.nan), dose_correlations(table, OPTIONS), "b", 0.95)
    assert any("No dose series" in line for line in empty)


def test_figure_has_three_labelled_panels_and_draws_the_trajectories(tmp_path):
    from repdiag.common.figures import save_figure

    table = series_table()
    table.loc[4, "step"] = 100.0  # m4 becomes a checkpoint of the lambda 1, seed 0 run
    table.loc[len(table)] = {**table.iloc[4].to_dict(), "model": "m8", "step": 300.0}
    figure = dose_figure(table, binding_column="binding_cosine", chance=0.125)
    dose_ax, jer_ax, step_ax = figure.axes[:3]
    assert dose_ax.get_xlabel().startswith("dose lambda") and dose_ax.get_xscale() == "symlog"
    assert jer_ax.get_title().startswith("within the series: r = ")
    assert step_ax.get_lines()[0].get_label() == "lambda 1, seed 0"
    assert step_ax.get_lines()[0].get_xdata().tolist() == [100.0, 300.0]
    png = save_figure(figure, tmp_path / "dose.png")[0]
    assert png.stat().st_size > 10_000
    empty = dose_figure(table.assign(dose=np.nan))
    assert "no dose series" in empty.axes[0].texts[0].get_text()
