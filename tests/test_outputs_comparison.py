"""The before/after comparison of workflow outputs (tests/outputs.py, `python -m tests.outputs`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr

from tests.outputs import differences, main


def _results(root: Path, value: float, created: str) -> Path:
    results = root / "results"
    (results / "tables").mkdir(parents=True)
    (results / "tables" / "t.csv").write_text("a,b\n1,2\n")
    (results / "m.json").write_text(
        json.dumps(
            {"value": value, "created": created, "git_commit": created, "saved_sha256": created}
        )
    )
    store = zarr.open_group(results / "s.zarr", mode="w")
    store.create_array("x", data=np.arange(4, dtype=np.float32) * value)
    return root


def test_equal_outputs_differ_only_in_stamps_and_each_difference_is_listed(tmp_path, capsys):
    before = _results(tmp_path / "before", 1.0, "monday")
    assert (
        differences(before / "results", _results(tmp_path / "same", 1.0, "tuesday") / "results")
        == []
    )
    assert main([str(before), str(tmp_path / "same")]) == 0
    assert "3 outputs, 0 differ" in capsys.readouterr().out

    after = _results(tmp_path / "after", 2.0, "tuesday")
    (after / "results" / "extra.txt").write_text("new")
    found = differences(before / "results", after / "results")
    assert [line.split(":")[0] for line in found] == ["extra.txt", "m.json", "s.zarr"]
    assert "only in" in found[0] and "3 of 4 values differ (max abs difference 3)" in found[2]
    assert main([str(before), str(after)]) == 1
