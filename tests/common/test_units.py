"""The unit of replication: Units from a table and its subsets, and the one check refusing
pooled checkpoints and rows without a unit or seed key, naming them (repdiag.common.units)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repdiag.common.units import ReplicationError, Units, check_units, require_independent


def six_runs(**changes) -> pd.DataFrame:
    """Six final networks m0..m5 of runs r0..r5, seeds 0, 0, 1, 1, 2, 2."""
    table = pd.DataFrame(
        {
            "model": [f"m{i}" for i in range(6)],
            "run": [f"r{i}" for i in range(6)],
            "seed": [0.0, 0.0, 1.0, 1.0, 2.0, 2.0],
            "x": [0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
            "y": [0.1, 0.9, 0.3, 1.2, -0.1, 0.8],
        }
    )
    for column, values in changes.items():
        table[column] = values
    return table


def test_pooled_checkpoints_are_refused_naming_the_rows():
    table = pd.DataFrame(
        {
            "model": ["dose_1_s0", "dose_1_s0_step100", "dose_1_s0_step200", "dose_1_s1"],
            "run": ["1/s0", "1/s0", "1/s0", "1/s1"],
            "seed": [0, 0, 0, 1],
        }
    )
    units = Units.of(table, "run", "seed")
    with pytest.raises(ReplicationError) as err:
        require_independent(units, table["model"], "r(JER, binding)")
    message = str(err.value)
    assert "r(JER, binding)" in message
    assert "dose_1_s0, dose_1_s0_step100, dose_1_s0_step200" in message
    assert "dose_1_s1" not in message
    finals = Units.of(table.iloc[[0, 3]], "run", "seed")
    require_independent(finals, ["dose_1_s0", "dose_1_s1"], "finals")


def test_the_check_keyed_text_forms_of_missing_and_trajectories():
    # "nan", "None", "" and "<NA>" as text are missing keys too (str() of NaN, None, pd.NA)
    for key in ("nan", "NaN", "None", "", " ", "<NA>", "n/a"):
        units = Units(("a", "b"), ("0", key), rows=("m_a", "m_b"))
        with pytest.raises(ReplicationError, match=r"m_b \(unit 'b', block"):
            check_units(units, "t")
    # a trajectory holds several rows of one run: with one_row_per_unit=False only the keys
    # are checked
    runs = Units(("a", "a", "b"), ("0", "0", "1"), rows=("a_100", "a", "b"))
    assert check_units(runs, "trajectories", one_row_per_unit=False) is runs
    with pytest.raises(ReplicationError, match="a: a_100, a"):
        check_units(runs, "t")
    with pytest.raises(ReplicationError, match="a_100 "):
        check_units(
            Units(("a", "a"), ("nan", "0"), rows=("a_100", "a")), "t", one_row_per_unit=False
        )
    # require_independent names the rows it is given, and refuses a row without a seed too
    with pytest.raises(ReplicationError, match=r"the causal base: .*m1 \(unit 'r1', block 'nan'\)"):
        require_independent(Units(("r0", "r1"), ("0", "nan")), ["m0", "m1"], "the causal base")
    with pytest.raises(ReplicationError, match="2 unit keys, 1 block keys"):
        Units(("a", "b"), ("0",))


def test_units_of_a_table_and_a_subset():
    table = six_runs()
    units = Units.of(table, "run", "seed", rows="model")
    assert units.block[:3] == ("0.0", "0.0", "1.0") and units.rows[-1] == "m5"
    assert (units.n_units, units.n_blocks) == (6, 3)
    part = units.take(np.array([False, True, False, False, True, False]))
    assert (part.unit, part.block, part.rows) == (("r1", "r4"), ("0.0", "2.0"), ("m1", "m4"))
    unnamed = Units(("a", "b", "c"), ("0", "0", "1")).take([2, 0])
    assert unnamed.rows == ("row 2", "row 0")
    assert Units.of(table.set_index("model"), "run").row_names[0] == "row m0"
