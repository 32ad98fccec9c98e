"""repdiag.encoders.vit_shortcuts: the class-token shortcuts equal timm's own forward."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from repdiag.encoders.vit_shortcuts import (
    cls_pooled_forward,
    cls_token_block,
    is_plain_timm_vit_block,
    timm_vit_derived,
)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _vit(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, **kwargs
    ).eval()


@pytest.mark.parametrize(
    "kwargs", [{}, {"qkv_bias": False}, {"qk_norm": True}, {"init_values": 0.1}]
)
def test_class_token_block_equals_the_full_block(kwargs, x):
    model = _vit(**kwargs)
    h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    for block in model.blocks:
        torch.testing.assert_close(cls_token_block(block, h), block(h)[:, 0])
        h = block(h)


def test_training_mode_runs_the_whole_block_and_eval_mode_the_shortcut(x):
    model = _vit()
    h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    block = model.blocks[0]
    assert is_plain_timm_vit_block(block)
    torch.testing.assert_close(cls_pooled_forward(block, h), block(h)[:, 0])
    block.train()
    torch.manual_seed(1)
    trained = cls_pooled_forward(block, h)
    torch.manual_seed(1)
    torch.testing.assert_close(trained, block(h)[:, 0])
    assert not is_plain_timm_vit_block(nn.Linear(3, 3))


def test_final_and_head_follow_from_the_last_class_token(x):
    model = _vit(num_classes=5)
    derived = timm_vit_derived(model, "block01", has_head=True)
    assert {name: parent for name, (parent, _) in derived.items()} == {
        "final": "block01",
        "head": "final",
    }
    tokens = model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x))))
    final = derived["final"][1](tokens[:, 0])
    torch.testing.assert_close(
        final, model.forward_head(model.forward_features(x), pre_logits=True)
    )
    torch.testing.assert_close(derived["head"][1](final), model(x))
    pooled = _vit(global_pool="avg", class_token=False)
    assert timm_vit_derived(pooled, "block01", has_head=False) == {}


# --- MAE's projection tap ------------------------------------------------------------------------

MAE_L = {
    "source": "timm",
    "id": "vit_large_patch16_224.mae",
    "family": "masked_modeling",
    "kwargs": {"img_size": 32},
}


def _random_weights(model: nn.Module, seed: int) -> None:
    """N(0, 0.02) matrices and tokens, unit norm scales, zero biases (timm's init, cheaper)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1 or "token" in name or "pos_embed" in name:
                p.normal_(0, 0.02, generator=generator)
            else:
                p.fill_(1.0 if name.endswith("weight") and "norm" in name else 0.0)


def test_a_24_block_vit_l_mae_has_a_depth_profile_through_its_projection():
    """The paper's MAE ViT-L/16 (24 blocks) at random weights, built on meta and filled on the
    CPU at 32 px (4 patches): taps in depth order ending final, projection; the projection is
    decoder_embed(final) exactly; JER at the first, middle and last block, final and projection."""
    from repdiag.encoders import build_encoder
    from repdiag.encoders.jacobian.engine import jacobian_spectra
    from repdiag.encoders.jacobian.jer import jer

    encoder = build_encoder("mae", MAE_L, meta=True)
    assert encoder.layers == [f"block{i:02d}" for i in range(24)] + ["final", "projection"]
    encoder.model.to_empty(device="cpu")
    _random_weights(encoder.model, 0)
    encoder.model.eval()
    images = torch.randint(0, 256, (1, 32, 32, 3), dtype=torch.uint8).numpy()
    x = encoder.preprocess(images)
    with torch.no_grad():
        outputs = encoder.layer_outputs(x)
    assert list(outputs) == encoder.layers
    assert outputs["projection"].shape == (1, 512) and outputs["block23"].shape == (1, 1024)
    projection = encoder.model.head
    torch.testing.assert_close(outputs["projection"], projection(outputs["final"]))
    depth = ["block00", "block12", "block23", "final", "projection"]
    spectra = jacobian_spectra(
        encoder, x, depth, method="randomized", k=3, power_iters=0, seed=0, precision="fp32"
    )
    assert all(bool((spectra[name] > 0).all() and spectra[name].isfinite().all()) for name in depth)
    profile = {name: float(jer(spectra[name])[0]) for name in depth}
    assert all(1.0 <= value <= 3.0 for value in profile.values()), profile  # JER of k = 3 values


def test_mae_projection_loads_decoder_embed_from_a_full_checkpoint_and_not_from_timms(tmp_path):
    from safetensors.torch import save_file

    from repdiag.encoders import build_encoder
    from repdiag.encoders.vit_shortcuts import MAE_DECODER_DIM, split_mae_decoder

    tiny = {"img_size": 32, "depth": 2, "embed_dim": 32, "num_heads": 2}
    torch.manual_seed(0)
    encoder_part = timm.create_model("vit_base_patch16_224.mae", pretrained=False, **tiny)
    decoder_embed = nn.Linear(32, MAE_DECODER_DIM)
    full = {
        **encoder_part.state_dict(),
        **{f"decoder_embed.{k}": v for k, v in decoder_embed.state_dict().items()},
        "mask_token": torch.zeros(1, 1, MAE_DECODER_DIM),
        "decoder_pred.weight": torch.zeros(768, MAE_DECODER_DIM),
    }
    kept, weights = split_mae_decoder(full)
    assert set(kept) == set(encoder_part.state_dict()) and set(weights) == {"weight", "bias"}
    save_file(full, str(tmp_path / "mae_full.safetensors"))
    entry = {**MAE_L, "id": "vit_base_patch16_224.mae", "kwargs": tiny}
    loaded = build_encoder("mae", {**entry, "pretrained": str(tmp_path / "mae_full.safetensors")})
    assert loaded.layers[-2:] == ["final", "projection"]
    x = loaded.preprocess(torch.rand(2, 32, 32, 3).numpy())
    out = loaded.layer_outputs(x, ["final", "projection"])
    torch.testing.assert_close(out["projection"], decoder_embed(out["final"]))
    # the encoder-only weights timm ships have no decoder: no projection tap, not a random one
    save_file(encoder_part.state_dict(), str(tmp_path / "mae.safetensors"))
    encoder_only = build_encoder("mae", {**entry, "pretrained": str(tmp_path / "mae.safetensors")})
    assert encoder_only.layers[-1] == "final"
