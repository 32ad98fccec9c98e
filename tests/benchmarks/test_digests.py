"""benchmarks/digests.py at a tiny size: both digests timed on one folder, the ratio theirs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import digests


def test_the_benchmark_times_both_digests_and_prints_their_ratio(capsys):
    result = digests.main(["--files", "20", "--kib", "4", "--rounds", "1"])
    assert result["manifest_s"] > 0 and result["content_s"] > 0
    assert result["ratio"] == result["content_s"] / result["manifest_s"]
    out = capsys.readouterr().out
    assert "20 files" in out and "content / manifest:" in out
