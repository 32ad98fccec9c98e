"""benchmarks/bytes_moved.py: the byte census by op class, on single ops and on the engine's pass
through the smallest ViT."""

from __future__ import annotations

import dataclasses
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
    for engine in ("landed", "rules"):
        census = result[engine]
        total, by_class = census["total_bytes"], census["bytes"]
        assert set(by_class) == set(bytes_moved.CLASSES)
        assert total > 0 and sum(by_class.values()) == total
        assert all(by_class[c] > 0 for c in ("matmul", "attention_bmm", "copies", "elementwise"))
        assert by_class["linalg"] > 0  # the power iterations' QR and the final SVD
        assert sum(census["fraction"].values()) == pytest.approx(1.0)
        assert 0 < census["detail"]["gelu"] < by_class["elementwise"]
        assert 0 < census["detail"]["copies_same_dtype"] <= by_class["copies"]
        assert census["model"]["layers"] == ["block00", "final"]
        assert census["model"]["tokens"] == 17
    landed, rules = result["landed"], result["rules"]
    assert result["ratio"] == rules["total_bytes"] / landed["total_bytes"] < 0.85
    # the rules change linear, layer norm and attention: GELU and QR/SVD move the same
    assert rules["bytes"]["linalg"] == landed["bytes"]["linalg"]
    assert rules["detail"]["gelu"] == landed["detail"]["gelu"]
    assert rules["bytes"]["other"] < 0.6 * landed["bytes"]["other"]  # layer norm's formula
    # no tokens x tokens primal copied per direction: fewer copies, fewer bytes through them
    assert rules["bytes"]["copies"] < 0.8 * landed["bytes"]["copies"]
    assert rules["bytes"]["attention_bmm"] < 0.7 * landed["bytes"]["attention_bmm"]
    printed = capsys.readouterr().out.splitlines()
    total_line = next(line for line in printed if line.strip().startswith("total"))
    assert f"{landed['total_bytes'] / 1e9:.3f}" in total_line
    assert f"{result['ratio']:.2f}" in total_line


def test_the_meta_device_counts_what_the_cpu_runs(bytes_moved):
    """Shapes alone fix the bytes: the meta census (how the ViT-L pass is counted) equals the
    CPU one but for the final copy of the spectra to the CPU."""
    spec = bytes_moved.small_vit(images=2, k=4, power_iters=1)
    cpu = bytes_moved.census(spec)
    meta = bytes_moved.census(dataclasses.replace(spec, device="meta"))
    for kind in ("matmul", "attention_bmm", "elementwise", "linalg"):
        assert meta["bytes"][kind] == cpu["bytes"][kind], kind
    # the hand-off: each tap's (2 images, k) float32 spectra copied, and made as zeros on the CPU
    extra = meta["total_bytes"] - cpu["total_bytes"]
    assert 0 <= extra <= 2 * 3 * (2 * 4) * 4
