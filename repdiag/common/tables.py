"""One way to write a table: CSV, atomically, NaN as an empty cell; markdown, NaN as n/a; and
one way to read such a CSV back."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from repdiag.core.errors import StoreError
from repdiag.core.store import atomic_path


def write_csv(frame: pd.DataFrame, path: str | Path, float_format: str | None = None) -> None:
    """Write ``frame`` as CSV at ``path`` (a temporary file renamed when done).

    ``float_format`` (e.g. ``"%.6g"``) rounds floats; ``None`` keeps full precision.
    """
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, na_rep="", float_format=float_format)


TEXT_COLUMNS = ("note", "run_text", "paper_text", "controls")
"""Columns read back as text, an empty cell as "" (not NaN)."""

LABEL_COLUMNS = ("model", "family", "arm", "reference", "base", "term", "metric", "run")
"""Columns of names read back verbatim: a name such as ``null`` or ``NA`` (the causal test's null
arm) is a label, not a missing value, which pandas' default reading would make it."""


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by :func:`write_csv`; a missing file names the rule to rerun."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"table {path} does not exist: run the workflow rule that produces it")
    header = pd.read_csv(path, nrows=0).columns
    from pandas._libs.parsers import STR_NA_VALUES  # pandas' default missing-value strings

    frame = pd.read_csv(
        path,
        keep_default_na=False,
        na_values={c: sorted(STR_NA_VALUES) for c in header if c not in LABEL_COLUMNS},
        dtype={c: str for c in LABEL_COLUMNS if c in header},
    )
    for column in TEXT_COLUMNS:
        if column in frame:
            frame[column] = frame[column].astype(object).fillna("").astype(str)
    return frame


def json_number(value: Any) -> float:
    """A JSON number as float; null, absent, a boolean or text -> NaN (a table's empty cell)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def format_number(value: Any, spec: str = ".3f") -> str:
    """``value`` formatted with ``spec``; NaN and inf as n/a, anything not a number as text."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "n/a" if not math.isfinite(number) else format(number, spec)


def markdown_table(frame: pd.DataFrame, spec: str = ".3f") -> str:
    """A GitHub markdown table (numbers formatted with ``spec``, NaN as n/a)."""
    header = "| " + " | ".join(str(c).replace("|", "\\|") for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = [
        "| "
        + " | ".join(
            (format_number(v, spec) if isinstance(v, float) else str(v)).replace("|", "\\|")
            for v in row
        )
        + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])
