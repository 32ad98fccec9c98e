"""Unit costs counted on the meta device (repdiag.encoders.jacobian.plan_count): closed forms on
an MLP, piecewise units against whole passes, the linear-algebra counts."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.jacobian import plan_count
from repdiag.encoders.jacobian.engine import Readout
from repdiag.encoders.jacobian.rewrites import jacobian_mode
from tests.encoders.jacobian.models import D_IN, FWD, encoder, mlp, tiny_vit

torch.set_num_threads(1)


def test_unit_costs_of_an_mlp_are_its_matmuls():
    units = plan_count.measure(mlp("meta"), torch.zeros(1, D_IN, device="meta"))
    assert units.fwd == FWD
    assert units.vjp == FWD  # input gradients only: one product per weight matrix
    assert units.jvp == FWD  # one more tangent direction: its products with the weights
    # once per vmapped call: the primal forward and functorch's primal x zero-weight-tangent mms
    assert units.jvp_call == 2 * FWD


def test_linear_algebra_counts():
    assert plan_count.qr_flops(10, 4, with_q=False) == pytest.approx(2 * 10 * 16 - 2 * 64 / 3)
    assert plan_count.qr_flops(4, 10) == pytest.approx(2 * (2 * 10 * 16 - 2 * 64 / 3))
    assert plan_count.svdvals_flops(6, 6) == pytest.approx(4 * 216 - 4 * 216 / 3)


def test_piecewise_units_equal_whole_passes():
    with torch.device("meta"):
        model = encoder(tiny_vit(), "cls")
    readout = Readout(model)
    x = torch.zeros(1, 3, 32, 32, device="meta")
    with jacobian_mode(model.model):
        units = plan_count.TapUnits(model, readout, x)
        assert units.pieces is not None
        for layer in model.layers:
            whole = plan_count.measure(lambda i, layer=layer: readout(i, (layer,))[layer], x)
            piece = units((layer,))
            assert (piece.fwd, piece.vjp, piece.jvp, piece.jvp_call) == (
                whole.fwd,
                whole.vjp,
                whole.jvp,
                whole.jvp_call,
            ), layer
