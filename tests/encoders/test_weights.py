"""Weights read safely (repdiag.encoders.weights): pickles refused without being unpickled,
truncated safetensors refused, every error naming the model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from repdiag.core.errors import EncoderError
from repdiag.encoders import build_encoder
from repdiag.encoders.entries import check_safetensors, model_error
from repdiag.encoders.weights import load_safetensors

torch.set_num_threads(1)


def test_pickle_checkpoints_are_refused_without_unpickling(tmp_path):
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, path)  # a torch.save zip archive under a safetensors name
    entry = {"source": "checkpoint", "id": "resnet18", "family": "other", "weights": str(path)}
    with pytest.raises(
        EncoderError,
        match=r"model 'pk': .*model.safetensors is a pickle \(torch.save\) file; it is refused",
    ):
        build_encoder("pk", entry)
    path.write_bytes(b"\x80\x04\x95" + b"\x00" * 40)  # a raw pickle (protocol 4)
    with pytest.raises(EncoderError, match="is a pickle"):
        build_encoder("pk", entry)
    path.write_bytes((10**6).to_bytes(8, "little") + b'{"w": ')  # header longer than the file
    with pytest.raises(
        EncoderError, match=r"model 'pk': .* is not a valid safetensors file \(truncated"
    ):
        build_encoder("pk", entry)


def test_a_good_file_is_read_and_errors_name_the_model(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.arange(4.0)}, str(path))
    assert check_safetensors(path, "m") == path
    assert torch.equal(load_safetensors(path, "m")["w"], torch.arange(4.0))
    assert str(model_error("m", "broken")) == "model 'm': broken"
    with pytest.raises(
        EncoderError, match=r"model 'm': weights file .*absent.safetensors does not"
    ):
        check_safetensors(tmp_path / "absent.safetensors", "m")


def test_entry_weights_follow_the_entry_prefix_and_strictness(tmp_path):
    from torch import nn

    from repdiag.encoders.weights import load_entry_weights

    source = nn.Linear(2, 3)
    state = {f"encoder.{k}": v for k, v in source.state_dict().items()}
    state["encoder.extra"] = torch.zeros(1)
    target = nn.Linear(2, 3)
    entry = {"weights": "w.safetensors", "state_dict_prefix": "encoder.", "strict": False}
    load_entry_weights(target, state, "m", entry)
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    with pytest.raises(EncoderError, match=r"model 'm': w.safetensors hold 1 weights the model"):
        load_entry_weights(target, state, "m", {**entry, "strict": True})
