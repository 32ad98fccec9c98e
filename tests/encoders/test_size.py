"""A model's size measured on the meta device (repdiag.encoders.size), against closed forms."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repdiag.core.errors import EncoderError
from repdiag.encoders import size as module
from repdiag.encoders.size import check_model_size, model_size


class Flat(nn.Module):
    def __init__(self, side: int, width: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(3 * side * side, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(x))


def test_parameters_and_activations_are_the_closed_forms() -> None:
    with torch.device("meta"):
        model = Flat(8, 5)
    size = model_size(model, 8)
    assert size.parameters == 3 * 64 * 5 + 5
    # Flatten's (1, 192) floats, Linear's (1, 5) and the model's own (1, 5) output, 4 bytes each
    assert size.activation_bytes == 4 * (192 + 5 + 5)


def test_a_model_that_cannot_run_on_meta_still_has_its_parameters_counted() -> None:
    with torch.device("meta"):
        model = Flat(8, 5)
    size = model_size(model, 9)  # wrong side: Linear fails, after Flatten's (1, 243) floats
    assert (size.parameters, size.activation_bytes, size.complete) == (
        3 * 64 * 5 + 5,
        4 * 243,
        False,
    )


def test_the_caps_refuse_with_the_model_and_where(monkeypatch: pytest.MonkeyPatch) -> None:
    with torch.device("meta"):
        model = Flat(8, 5)
    monkeypatch.setattr(module, "MAX_PARAMETERS", 100)
    with pytest.raises(EncoderError, match=r"model 'm': models\.m builds 0\.0 G parameters"):
        check_model_size("m", model, 8, "models.m")
    monkeypatch.setattr(module, "MAX_PARAMETERS", 10**6)
    monkeypatch.setattr(module, "MAX_ACTIVATION_BYTES", 100)
    with pytest.raises(EncoderError, match=r"models\.m: one 8 px image makes .* GiB"):
        check_model_size("m", model, 8, "models.m")
    monkeypatch.setattr(module, "MAX_ACTIVATION_BYTES", 4 * 202)
    assert check_model_size("m", model, 8, "models.m").activation_bytes == 4 * 202


def test_a_built_model_is_not_measured() -> None:
    with pytest.raises(ValueError, match="meta device"):
        check_model_size("m", Flat(2, 2), 2, "models.m")
