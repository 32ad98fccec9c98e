"""JER formulas (repdiag.encoders.jacobian.jer): closed forms, top k, the zero spectrum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repdiag.core.errors import RegistryError
from repdiag.encoders.jacobian.jer import jer

F64 = torch.float64


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], {"pr": 4.0, "pr2": 4.0, "entropy": 4.0}),
        ([5.0, 0.0, 0.0], {"pr": 1.0, "pr2": 1.0, "entropy": 1.0}),
        (
            [3.0, 1.0],
            {
                "pr": 16 / 10,
                "pr2": 100 / 82,
                "entropy": math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))),
            },
        ),
    ],
)
def test_jer_formulas_match_closed_forms(s, expected):
    for formula, value in expected.items():
        assert jer(torch.tensor([s], dtype=F64), formula).item() == pytest.approx(value, rel=1e-12)


def test_jer_uses_top_k_whatever_the_order_and_a_zero_spectrum_has_rank_zero():
    s = torch.tensor([[1.0, 4.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    top2 = jer(s, "pr", top_k=2)
    assert top2[0].item() == pytest.approx((4 + 3) ** 2 / (16 + 9))
    assert top2[1].item() == 0.0
    assert jer(np.array([2.0, 2.0]), "entropy").item() == pytest.approx(2.0)
    with pytest.raises(RegistryError, match="unknown JER formula 'nope'"):
        jer(s, "nope")
