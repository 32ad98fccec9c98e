"""The unit of replication and its checks: which training run each row of an analysis is, the
block (usually the seed) it belongs to, and the one check every statistical primitive makes.

A network measured twice is one observation, and checkpoints of one run are not independent of
its final network. Every study states its unit once (:class:`Units`: which run each row is, the
block it belongs to, and the row's name for messages). :func:`check_units` is the check every
primitive of :mod:`repdiag.common.replication`, :mod:`repdiag.common.statistics` and the studies
makes before it computes anything: a call in which two rows are one unit, or a row has no unit
or block key (NaN, None, ``"nan"``: a run whose seed was not recorded), is refused with
:class:`ReplicationError`, naming the rows, so no analysis can pool them by accident.
:func:`require_independent` makes the same check on rows named by the caller (checkpoints
pooled with their run, a network listed twice).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repdiag.core.errors import ConfigError


class ReplicationError(ConfigError):
    """An analysis whose rows are not independent units."""


MISSING_KEYS = frozenset({"", "nan", "none", "null", "<na>", "nat", "n/a"})
"""Unit or block keys that say the key is missing (as ``str`` writes NaN, None, pd.NA, NaT)."""


def missing_key(key: object) -> bool:
    """Whether a unit or block key is missing: None, a float NaN, or a text of
    :data:`MISSING_KEYS` (any case, spaces stripped)."""
    if key is None or (isinstance(key, float) and math.isnan(key)):
        return True
    return str(key).strip().lower() in MISSING_KEYS


@dataclass(frozen=True)
class Units:
    """The unit of each row of an analysis: ``unit[i]`` names the training run row i belongs
    to, ``block[i]`` its block (the seed); ``name`` says what a unit is (``training run``,
    ``objective``) for the tables; ``rows`` names the rows (the models) in the messages of
    :func:`check_units` (``row <i>`` when empty)."""

    unit: tuple[str, ...]
    block: tuple[str, ...]
    name: str = "training run"
    rows: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.block) != len(self.unit) or (self.rows and len(self.rows) != len(self.unit)):
            raise ReplicationError(
                f"Units: {len(self.unit)} unit keys, {len(self.block)} block keys and "
                f"{len(self.rows)} row names; give one of each per row"
            )

    @classmethod
    def of(
        cls,
        table: pd.DataFrame,
        unit: str,
        block: str | None = None,
        name: str = "training run",
        rows: str | None = None,
    ) -> Units:
        """Units from a table's columns (``block`` None: every row in one block ``all``;
        ``rows`` None: rows named by the table's index)."""
        missing = [c for c in (unit, block, rows) if c is not None and c not in table.columns]
        if missing:
            raise ConfigError(
                f"the table has no unit column(s) {missing}; available: {list(table.columns)}"
            )
        units = tuple(str(v) for v in table[unit])
        blocks = tuple(str(v) for v in table[block]) if block else ("all",) * len(units)
        names = table[rows] if rows else [f"row {i}" for i in table.index]
        return cls(units, blocks, name, tuple(str(v) for v in names))

    @property
    def n_units(self) -> int:
        return len(set(self.unit))

    @property
    def n_blocks(self) -> int:
        return len(set(self.block))

    @property
    def row_names(self) -> tuple[str, ...]:
        return self.rows or tuple(f"row {i}" for i in range(len(self.unit)))

    def take(self, rows: Sequence[int] | np.ndarray) -> Units:
        """The units of a subset of the rows (integer positions or a boolean mask)."""
        index = np.arange(len(self.unit))[np.asarray(rows)]
        pick = [int(i) for i in index]
        names = tuple(self.rows[i] for i in pick) if self.rows else tuple(f"row {i}" for i in pick)
        return Units(
            tuple(self.unit[i] for i in pick), tuple(self.block[i] for i in pick), self.name, names
        )


def check_units(
    units: Units, what: str, n_rows: int | None = None, *, one_row_per_unit: bool = True
) -> Units:
    """The check every primitive makes before it computes anything: ``units`` is a
    :class:`Units` of ``n_rows`` rows, every row has a unit and a block key (not NaN, None or
    ``"nan"``: :func:`missing_key`), and, with ``one_row_per_unit``, no two rows are one unit.
    Refuses ``what`` with :class:`ReplicationError` naming the rows, and says what to do;
    returns ``units``. ``one_row_per_unit=False`` is for tables that hold a run's checkpoints
    as a trajectory (shown, not tested): their keys are checked, not their number."""
    if not isinstance(units, Units):
        raise ReplicationError(
            f"{what}: takes the Units of its rows (repdiag.common.units.Units: the unit "
            f"and the block of each row), not {type(units).__name__}; build them with Units.of"
        )
    if n_rows is not None and len(units.unit) != n_rows:
        raise ReplicationError(
            f"{what}: {len(units.unit)} units for {n_rows} rows; give the unit of every row"
        )
    names = units.row_names
    unkeyed = [
        f"{row} (unit {unit!r}, block {block!r})"
        for row, unit, block in zip(names, units.unit, units.block, strict=True)
        if missing_key(unit) or missing_key(block)
    ]
    if unkeyed:
        raise ReplicationError(
            f"{what}: rows without a {units.name} or block key (NaN or None): "
            f"{'; '.join(unkeyed)}. Record the run and seed of every row (a run whose seed is "
            "NaN belongs to no block and would be keyed 'nan'), or leave those rows out"
        )
    if not one_row_per_unit:
        return units
    shared: dict[str, list[str]] = {}
    for row, unit in zip(names, units.unit, strict=True):
        shared.setdefault(unit, []).append(str(row))
    repeated = {unit: rows for unit, rows in shared.items() if len(rows) > 1}
    if repeated:
        raise ReplicationError(
            f"{what}: rows are not independent units ({units.name}): {_listed(repeated)}. Keep "
            f"one row per {units.name} (the final checkpoint of a run; the mean over the seeds "
            "of an objective) and analyse checkpoints apart as trajectories"
        )
    return units


def require_independent(units: Units, rows: Sequence[str], what: str) -> None:
    """Refuse ``what`` when two of its rows (named by ``rows``) are the same unit, or a row has
    no unit or block key (:func:`check_units`): an analysis that treats checkpoints of one run
    (or one network listed twice) as independent points."""
    names = tuple(str(row) for row in rows)
    if len(names) != len(units.unit):
        raise ReplicationError(f"{what}: {len(names)} row names for {len(units.unit)} units")
    check_units(Units(units.unit, units.block, units.name, names), what)


def _short(label: str, width: int = 60) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _listed(repeated: dict[str, list[str]], shown: int = 3) -> str:
    """The first ``shown`` repeated units with their rows (a unit's label cut to 60 characters:
    the rows name it), then how many more."""
    items = list(repeated.items())
    text = "; ".join(f"{_short(unit)}: {', '.join(rows)}" for unit, rows in items[:shown])
    more = len(items) - shown
    return text + (
        f"; and {more} more unit{'s' if more > 1 else ''} like these" if more > 0 else ""
    )
