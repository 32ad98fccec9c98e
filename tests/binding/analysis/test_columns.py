"""Names of the models table's columns (repdiag.binding.analysis.columns)."""

from __future__ import annotations

import pandas as pd

from repdiag.binding.analysis.columns import l_iso_columns, metric_label


def test_l_iso_columns_are_ordered_by_k_not_by_text():
    table = pd.DataFrame(
        columns=["model", "l_iso_k20", "l_iso_k5", "l_iso_k100", "l_iso_kx", "jer"]
    )
    assert l_iso_columns(table) == ["l_iso_k5", "l_iso_k20", "l_iso_k100"]
    assert l_iso_columns(pd.DataFrame(columns=["model"])) == []


def test_metric_labels():
    assert metric_label("g_iso") == "G.Iso"
    assert metric_label("same_different") == "Same/Different accuracy"
    assert metric_label("l_iso_k10") == "L.Iso (k=10)"
    assert metric_label("jer_pr_final") == "JER pr (final)"
    assert metric_label("jer_entropy_max") == "JER entropy (max)"
    assert metric_label("binding_knn") == "binding accuracy (knn)"
    assert metric_label("zero_shot_accuracy") == "zero_shot_accuracy"
