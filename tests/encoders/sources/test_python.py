"""Source python (repdiag.encoders.sources.python): exactly what the user's module computes, with
its own preprocessing; on the meta device, built as it is and then moved there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repdiag.encoders import build_encoder
from tests.encoders.sources.helpers import random_images

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return random_images()


def test_python_encoder_gives_exactly_what_its_module_computes(images):
    from tests.encoders.custom_encoders import TokenNet

    entry = {
        "source": "python",
        "id": "tests.encoders.custom_encoders:token_net",
        "family": "other",
        "kwargs": {"depth": 2},
    }
    enc = build_encoder("mine", entry)
    assert enc.layers == ["block00", "block01", "final"]
    assert enc.preprocess.as_dict() == {**TokenNet.preprocess_cfg}
    x = enc.preprocess(images)
    assert x.shape == (3, 3, 16, 16)
    reference = TokenNet(depth=2).eval()
    out = enc.layer_outputs(x)
    torch.testing.assert_close(out["final"], reference(x), rtol=0, atol=0)
    for i, tokens in enumerate(reference.tokens(x)):
        torch.testing.assert_close(out[f"block0{i}"], tokens[:, 0], rtol=0, atol=0)
    vit = build_encoder(
        "v",
        {"source": "python", "id": "tests.encoders.custom_encoders:small_vit", "family": "other"},
    )
    assert vit.layers == ["block00", "block01", "final", "head"] and vit.preprocess.input_size == 32


def test_meta_mode_moves_the_built_module_to_the_meta_device():
    entry = {
        "source": "python",
        "id": "tests.encoders.custom_encoders:small_vit",
        "family": "other",
    }
    encoder = build_encoder("v", entry, meta=True)
    assert all(p.device.type == "meta" for p in encoder.model.parameters())
    assert encoder.origin == "python tests.encoders.custom_encoders:small_vit"
    assert encoder.layers == build_encoder("v", entry).layers
