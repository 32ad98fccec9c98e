"""Names of the models table's columns: the L.Iso columns and the human label of each column."""

from __future__ import annotations

import re

import pandas as pd

LABELS = {
    "g_pr": "G.PR",
    "g_iso": "G.Iso",
    "effective_rank": "effective rank",
    "participation_ratio": "participation ratio",
    "jer": "JER",
    "same_different": "Same/Different accuracy",
    "binding": "binding accuracy",
}


def metric_label(column: str) -> str:
    """Human name of a models-table column (``l_iso_k10`` -> ``L.Iso (k=10)``)."""
    if column in LABELS:
        return LABELS[column]
    if match := re.fullmatch(r"l_iso_k(\d+)", column):
        return f"L.Iso (k={match.group(1)})"
    if match := re.fullmatch(r"jer_(\w+?)_(final|max)", column):
        return f"JER {match.group(1)} ({match.group(2)})"
    if match := re.fullmatch(r"binding_(\w+)", column):
        return f"binding accuracy ({match.group(1)})"
    return column


def l_iso_columns(table: pd.DataFrame) -> list[str]:
    """The table's L.Iso columns (``l_iso_k<k>``) in increasing k."""
    return sorted(
        (c for c in table.columns if re.fullmatch(r"l_iso_k\d+", c)), key=lambda c: int(c[7:])
    )
