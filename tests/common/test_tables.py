"""One way to write a table: CSV without an index, NaN as an empty cell, atomic (repdiag.common.tables)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from repdiag.common.tables import read_table, write_csv
from repdiag.core.errors import StoreError


def test_round_trip_with_nan_as_an_empty_cell(tmp_path):
    frame = pd.DataFrame({"model": ["a", "b"], "jer": [1.0 / 3.0, math.nan], "n": [3, 4]})
    path = tmp_path / "tables" / "t.csv"  # the folder is made
    write_csv(frame, path)
    assert path.read_text().splitlines() == ["model,jer,n", f"a,{1.0 / 3.0!r},3", "b,,4"]
    back = pd.read_csv(path)
    assert back["jer"].iloc[0] == 1.0 / 3.0  # full precision by default
    assert np.isnan(back["jer"].iloc[1])


def test_names_are_read_back_verbatim_and_numbers_as_numbers(tmp_path):
    """The causal test's null arm is named "null", which pandas reads as NaN by default: a label
    column keeps it (a found bug: the figure's null arm was labelled "nan")."""
    frame = pd.DataFrame(
        {
            "arm": ["null", "NA", "raise"],
            "term": ["", "jer", "jer"],
            "binding": [0.5, math.nan, 1.0],
        }
    )
    write_csv(frame, tmp_path / "arms.csv")
    back = read_table(tmp_path / "arms.csv")
    assert back["arm"].tolist() == ["null", "NA", "raise"] and back["term"].tolist()[0] == ""
    assert back["binding"].iloc[0] == 0.5 and np.isnan(back["binding"].iloc[1])
    assert (
        pd.read_csv(tmp_path / "arms.csv")["arm"].isna().sum() == 2
    )  # the default would lose them


def test_float_format_rounds_floats_only(tmp_path):
    path = tmp_path / "t.csv"
    write_csv(pd.DataFrame({"x": [0.123456789], "k": [7]}), path, float_format="%.3g")
    assert path.read_text().splitlines() == ["x,k", "0.123,7"]


def test_a_failed_write_keeps_the_old_table_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "t.csv"
    write_csv(pd.DataFrame({"x": [1]}), path)

    class Unwritable(pd.DataFrame):
        def to_csv(self, *args, **kwargs):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_csv(Unwritable({"x": [2]}), path)
    assert path.read_text() == "x\n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_two_writes_of_the_same_frame_are_byte_identical(tmp_path):
    frame = pd.DataFrame({"a": np.linspace(0, 1, 7), "b": list("abcdefg")})
    write_csv(frame, tmp_path / "1.csv")
    write_csv(frame, tmp_path / "2.csv")
    assert (tmp_path / "1.csv").read_bytes() == (tmp_path / "2.csv").read_bytes()


def test_markdown_table_formats_numbers_and_escapes_pipes():
    from repdiag.common.tables import format_number, markdown_table

    frame = pd.DataFrame({"a|b": ["x|y", "z"], "v": [1.0 / 3.0, math.nan], "n": [3, 4]})
    assert markdown_table(frame).splitlines() == [
        "| a\\|b | v | n |",
        "|---|---|---|",
        "| x\\|y | 0.333 | 3 |",
        "| z | n/a | 4 |",
    ]
    assert format_number(math.inf) == "n/a" and format_number("text") == "text"
    assert format_number(2.5, ".0f") == "2"


def test_read_table_reads_text_columns_as_text_and_names_a_missing_table(tmp_path):
    frame = pd.DataFrame(
        {
            "metric": ["jer", "g_iso"],
            "r": [0.5, math.nan],
            "note": ["", "too few"],
            "controls": ["", "zs"],
        }
    )
    write_csv(frame, tmp_path / "t.csv")
    back = read_table(tmp_path / "t.csv")
    assert back["note"].tolist() == ["", "too few"] and back["controls"].tolist() == ["", "zs"]
    assert back["r"].iloc[0] == 0.5 and math.isnan(back["r"].iloc[1])
    with pytest.raises(StoreError, match=r"none\.csv does not exist: run the workflow rule"):
        read_table(tmp_path / "none.csv")
