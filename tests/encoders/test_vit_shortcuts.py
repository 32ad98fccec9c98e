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
