"""One way to write a table: CSV, atomically, NaN as an empty cell."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repdiag.core.store import atomic_path


def write_csv(frame: pd.DataFrame, path: str | Path, float_format: str | None = None) -> None:
    """Write ``frame`` as CSV at ``path`` (a temporary file renamed when done).

    ``float_format`` (e.g. ``"%.6g"``) rounds floats; ``None`` keeps full precision.
    """
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, na_rep="", float_format=float_format)
