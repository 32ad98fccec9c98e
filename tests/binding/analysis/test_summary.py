"""``results/summary.md``: every model and control with intervals and JER by tap
(repdiag.binding.analysis.summary)."""

from __future__ import annotations

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.analysis.statistics import statistics_tables
from repdiag.binding.analysis.summary import files_section, model_results, summary_markdown
from tests.binding.stats_fakes import SETTINGS, model_paths


def test_the_summary_lists_every_model_with_intervals_and_jer_by_tap(fake_run):
    root, models, _ = fake_run
    result = aggregate(models, *model_paths(root, models), SETTINGS)
    table = result.models.copy()
    table.loc[table["model"] == "m05", "family"] = "control"
    table["binding_cosine_win"] = 0.5 + 0.5 * table["binding_cosine"]  # tied to accuracy here
    tables = statistics_tables(table, result.depth, SETTINGS)
    rows = model_results(table, result.depth, SETTINGS).set_index("model")
    assert list(rows.index) == list(table["model"])  # controls too
    first = table.iloc[0]
    low, high = first["binding_cosine_ci_low"], first["binding_cosine_ci_high"]
    assert rows.loc[first["model"], "binding cosine"] == (
        f"{first['binding_cosine']:.3f} [{low:.2f}, {high:.2f}]"
    )
    profile = result.depth.query(
        "model == @first.model and formula == @SETTINGS.jer_formula "
        "and probe_set == @SETTINGS.probe_set"
    ).sort_values("layer_index")
    assert len(profile) >= 2
    expected = " → ".join(f"{v:.1f}" for v in profile["jer_mean"])
    assert rows.loc[first["model"], "JER by tap"] == expected
    assert rows.loc[first["model"], "JER final"] == f"{first['jer']:.1f}"
    text = summary_markdown(table, {**tables, "depth_profiles": result.depth}, SETTINGS)
    assert "## Every model and control" in text and expected in text
    assert "## Every model and control" not in summary_markdown(table, tables, SETTINGS)
    # the other score beside the headline's, and what the run's n can answer
    robust = tables["robustness"].set_index(["target", "metric"])
    win_jer = robust.loc[("binding_cosine_win", SETTINGS.jer_column), "pearson_r"]
    other = next(line for line in text.splitlines() if "against the win rate" in line)
    assert f"JER r = {win_jer:.3f}" in other and "G.PR r = " in other
    contrast = tables["ols"].query("formula == 'binding ~ jer + g_pr'").set_index("term")
    line = next(line for line in text.splitlines() if "JER beyond global geometry" in line)
    assert f"jer {contrast.loc['jer', 'coef']:.3g} [" in line and "g_pr " in line
    power = next(line for line in text.splitlines() if line.startswith("- What n = "))
    correlations = tables["correlations"]
    jer_row = correlations[(correlations["metric"] == "jer")].iloc[0]
    assert f"power {jer_row['power_at_paper_r']:.2f}" in power and "binding_families" in power


def test_the_files_section_names_the_folder_the_tables_were_read_from() -> None:
    main = "\n".join(files_section())
    assert "`results/tables/`" in main and "`results/figures/`" in main
    families = "\n".join(files_section("results/binding_families"))
    assert "`results/binding_families/`" in families and "results/tables/" not in families
    assert "metric_scatter" in families
