"""One way to write a table: CSV, atomically, NaN as an empty cell; markdown, NaN as n/a."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from repdiag.core.store import atomic_path


def write_csv(frame: pd.DataFrame, path: str | Path, float_format: str | None = None) -> None:
    """Write ``frame`` as CSV at ``path`` (a temporary file renamed when done).

    ``float_format`` (e.g. ``"%.6g"``) rounds floats; ``None`` keeps full precision.
    """
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, na_rep="", float_format=float_format)


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
