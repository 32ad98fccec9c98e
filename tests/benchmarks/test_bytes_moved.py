"""benchmarks/bytes_moved.py: the byte census by op class, on single ops and on the engine's pass
through the smallest ViT."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bytes_moved():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("bytes_moved")


def test_each_op_counts_its_inputs_and_outputs_in_its_class(bytes_moved):
    a, b = torch.ones(3, 4), torch.ones(4, 5)
    scores, values = torch.ones(2, 5, 5), torch.ones(2, 5, 3)
    with bytes_moved.ByteCensus(tokens=5) as counter:
        a @ b  # mm: 12 + 20 in, 15 out
        scores @ values  # a tokens x tokens operand: attention's bmm (50 + 30 in, 30 out)
        a.t()  # a view: nothing
        a + 1  # pointwise: 12 in, 12 out
        a.clone()  # a copy: 12 in, 12 out
        a.to(torch.float64)  # a copy to another dtype: 12 x 4 in, 12 x 8 out
    assert counter.bytes == {
        "matmul": 47 * 4,
        "attention_bmm": 110 * 4,
        "copies": 24 * 4 + 12 * 12,
        "elementwise": 24 * 4,
        "linalg": 0,
        "other": 0,
    }
    assert counter.detail["copies_same_dtype"] == 24 * 4


def test_the_census_of_the_smallest_vit_pass_sums_to_its_total(bytes_moved, capsys):
    result = bytes_moved.main(
        ["--depth", "2", "--dim", "32", "--size", "32", "--k", "4", "--power-iters", "1"]
    )
    total, by_class = result["total_bytes"], result["bytes"]
    assert set(by_class) == set(bytes_moved.CLASSES)
    assert total > 0 and sum(by_class.values()) == total
    assert all(by_class[c] > 0 for c in ("matmul", "attention_bmm", "copies", "elementwise"))
    assert by_class["linalg"] > 0  # the power iterations' QR and the final SVD
    assert sum(result["fraction"].values()) == pytest.approx(1.0)
    assert 0 < result["detail"]["gelu"] < by_class["elementwise"]
    assert 0 < result["detail"]["copies_same_dtype"] <= by_class["copies"]
    assert result["model"]["layers"] == ["block00", "final"] and result["model"]["tokens"] == 17
    printed = capsys.readouterr().out
    assert f"{total / 1e9:.3f} GB moved" in printed.splitlines()[0]
