"""Taps equal the intermediate outputs of a plain forward pass, and differentiate like the model."""

from __future__ import annotations

import open_clip
import pytest
import timm
import torch
import torchvision
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchvision.models.convnext import CNBlockConfig, ConvNeXt

from repdiag.core.errors import EncoderError
from repdiag.encoders import layer_outputs
from repdiag.encoders.taps import tap_plan

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, depth=3, num_classes=5
    ).eval()


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def timm_vit_tokens(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """timm VisionTransformer.forward_features, step by step."""
    h = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    tokens = []
    for block in model.blocks:
        h = block(h)
        tokens.append(h)
    return tokens


def test_timm_vit_taps_equal_the_plain_forward(vit, x):
    with torch.no_grad():
        tokens = timm_vit_tokens(vit, x)
        cls_taps = layer_outputs(vit, x, pooling="cls")
        mean_taps = layer_outputs(vit, x, pooling="mean")
        reference_final = vit.forward_head(vit.forward_features(x), pre_logits=True)
        logits = vit(x)
    assert list(cls_taps) == ["block00", "block01", "block02", "final", "head"]
    for i, h in enumerate(tokens):
        torch.testing.assert_close(cls_taps[f"block0{i}"], h[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(mean_taps[f"block0{i}"], h[:, 1:].mean(dim=1), rtol=0, atol=0)
    torch.testing.assert_close(cls_taps["final"], reference_final, rtol=0, atol=0)
    torch.testing.assert_close(cls_taps["head"], logits, rtol=0, atol=0)
    torch.testing.assert_close(
        mean_taps["final"], cls_taps["final"]
    )  # final is the model's own pooling


def test_only_block_layers_stop_the_forward_after_the_deepest(vit, x):
    calls = []
    handle = vit.blocks[2].register_forward_hook(lambda *args: calls.append(1))
    try:
        shallow = layer_outputs(vit, x, ["block01", "block00"])
    finally:
        handle.remove()
    assert list(shallow) == ["block00", "block01"] and not calls
    torch.testing.assert_close(shallow["block01"], timm_vit_tokens(vit, x)[1][:, 0])
    assert not vit._forward_hooks and not any(b._forward_hooks for b in vit.blocks)  # hooks removed


def test_timm_resnet_stages_are_global_average_pooled(x):
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=3).eval()
    with torch.no_grad():
        taps = layer_outputs(model, x)
        h = model.maxpool(model.act1(model.bn1(model.conv1(x))))
        for i, layer in enumerate([model.layer1, model.layer2, model.layer3, model.layer4]):
            h = layer(h)
            torch.testing.assert_close(taps[f"stage{i}"], h.mean(dim=(2, 3)), rtol=0, atol=0)
        torch.testing.assert_close(taps["final"], h.mean(dim=(2, 3)))
        torch.testing.assert_close(taps["head"], model(x), rtol=0, atol=0)


def test_torchvision_resnet_vit_and_convnext_taps(x):
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None, num_classes=3).eval()
    vit = torchvision.models.VisionTransformer(
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
        num_classes=3,
    ).eval()
    convnext = ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=3).eval()
    with torch.no_grad():
        taps = layer_outputs(resnet, x)
        h = resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(x))))
        for i in range(4):
            h = getattr(resnet, f"layer{i + 1}")(h)
            torch.testing.assert_close(taps[f"stage{i}"], h.mean(dim=(2, 3)), rtol=0, atol=0)
        torch.testing.assert_close(
            taps["final"], torch.flatten(resnet.avgpool(h), 1), rtol=0, atol=0
        )
        torch.testing.assert_close(taps["head"], resnet(x), rtol=0, atol=0)

        taps = layer_outputs(vit, x)
        assert list(taps) == ["block00", "block01", "final", "head"]
        h = vit._process_input(x)
        h = vit.encoder.dropout(
            torch.cat([vit.class_token.expand(4, -1, -1), h], 1) + vit.encoder.pos_embedding
        )
        for i, block in enumerate(vit.encoder.layers):
            h = block(h)
            torch.testing.assert_close(taps[f"block0{i}"], h[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(taps["final"], vit.encoder.ln(h)[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(taps["head"], vit(x), rtol=0, atol=0)

        taps = layer_outputs(convnext, x)
        assert list(taps) == ["stage0", "stage1", "final", "head"]
        h = convnext.features[1](convnext.features[0](x))
        torch.testing.assert_close(taps["stage0"], h.mean(dim=(2, 3)), rtol=0, atol=0)
        torch.testing.assert_close(taps["head"], convnext(x), rtol=0, atol=0)


def test_open_clip_vit_taps_equal_the_plain_forward(x):
    torch.manual_seed(0)
    model = open_clip.create_model(
        "ViT-S-32",
        embed_dim=24,
        vision_cfg={"image_size": 32, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
        text_cfg={"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
    ).eval()
    visual = model.visual
    with torch.no_grad():
        taps = layer_outputs(
            model, x, pooling="mean"
        )  # the full CLIP model: its image tower is tapped
        h = visual._embeds(x)
        for i, block in enumerate(visual.transformer.resblocks):
            h = block(h)
            torch.testing.assert_close(taps[f"block0{i}"], h[:, 1:].mean(1), rtol=0, atol=0)
        torch.testing.assert_close(taps["final"], visual.ln_post(h)[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(taps["head"], model.encode_image(x), rtol=0, atol=0)


def test_vjp_of_a_tap_matches_autograd(vit, x):
    def tap(images: torch.Tensor) -> torch.Tensor:
        return layer_outputs(vit, images, ["block01"])["block01"]

    cotangent = torch.randn(4, 192, generator=torch.Generator().manual_seed(2))
    _, vjp_fn = torch.func.vjp(tap, x)
    (grad_func,) = vjp_fn(cotangent)
    leaf = x.clone().requires_grad_(True)
    (grad_autograd,) = torch.autograd.grad(tap(leaf), leaf, cotangent)
    torch.testing.assert_close(grad_func, grad_autograd)
    assert grad_func.abs().sum() > 0


def test_jvp_vmap_and_jacobian_through_taps(vit, x):
    def final(images: torch.Tensor) -> torch.Tensor:
        return layer_outputs(vit, images, ["final"])["final"]

    tangent = torch.randn_like(x)
    cotangent = torch.randn(4, 192)
    with sdpa_kernel(SDPBackend.MATH):  # fused CPU attention has no forward-mode rule
        _, jvp_out = torch.func.jvp(final, (x,), (tangent,))
    _, vjp_fn = torch.func.vjp(final, x)
    (vjp_out,) = vjp_fn(cotangent)
    # <u, J v> computed forward and backward
    torch.testing.assert_close(
        (cotangent * jvp_out).sum(), (vjp_out * tangent).sum(), rtol=1e-4, atol=1e-4
    )

    per_image = torch.func.vmap(
        lambda image: layer_outputs(vit, image[None], ["block02"])["block02"][0]
    )
    with sdpa_kernel(SDPBackend.MATH):  # nor a batching rule
        batched = per_image(x)
    torch.testing.assert_close(
        batched, layer_outputs(vit, x, ["block02"])["block02"], rtol=1e-5, atol=1e-5
    )

    small = x[:1, :, :16, :16]
    model = timm.create_model("resnet18", pretrained=False, num_classes=0).eval()
    jac = torch.func.jacrev(lambda img: layer_outputs(model, img, ["stage0"])["stage0"])(small)
    reference = torch.autograd.functional.jacobian(
        lambda img: layer_outputs(model, img, ["stage0"])["stage0"], small
    )
    torch.testing.assert_close(jac, reference)


def test_generic_modules_and_errors(x):
    from tests.encoders.custom_encoders import conv_net

    model = conv_net()
    plan = tap_plan(model)
    assert plan.layers == ["final"]
    torch.testing.assert_close(layer_outputs(model, x)["final"], model(x).mean(dim=(2, 3)))
    with pytest.raises(
        EncoderError,
        match=r"unknown layers \['block07'\] for module Sequential; its layers are \['final'\]",
    ):
        layer_outputs(model, x, ["block07"])
    with pytest.raises(EncoderError, match="pooling 'max' is not one of"):
        tap_plan(model, "max")
    no_cls = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        depth=1,
        class_token=False,
        global_pool="avg",
    )
    with pytest.raises(
        EncoderError, match="has no class token, so pooling 'cls' is undefined: set pooling: mean"
    ):
        tap_plan(no_cls, "cls")
    assert tap_plan(no_cls, "mean").layers == ["block00", "final", "head"]


def test_one_block_tap_alone_equals_the_same_tap_of_a_full_pass(vit, x):
    plan = tap_plan(vit, "cls")
    assert all(tap.pooled_forward is not None for tap in plan.blocks)
    full = layer_outputs(vit, x)
    for name in plan.layers:
        torch.testing.assert_close(layer_outputs(vit, x, [name])[name], full[name])


def test_derived_taps_are_the_function_of_their_parent(vit, x):
    plan = tap_plan(vit, "cls")
    full = layer_outputs(vit, x)
    assert {tap: parent for tap, (parent, _) in plan.derived.items()} == {
        "final": "block02",
        "head": "final",
    }
    for tap, (parent, fn) in plan.derived.items():
        torch.testing.assert_close(fn(full[parent]), full[tap])


def test_mean_pooling_has_no_class_token_shortcut_and_no_derived_final(vit):
    plan = tap_plan(vit, "mean")
    assert all(tap.pooled_forward is None for tap in plan.blocks)
    assert plan.derived == {}


def test_a_lone_block_tap_in_train_mode_runs_the_whole_block(x):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2)
    model.train()  # no dropout configured: the same numbers as eval, through block.forward
    full = layer_outputs(model, x)
    torch.testing.assert_close(layer_outputs(model, x, ["block01"])["block01"], full["block01"])


def test_vit_subclasses_that_pool_other_tokens_get_no_derived_final(x):
    torch.manual_seed(0)
    deit = timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, depth=2
    ).eval()
    plan = tap_plan(deit, "cls")
    assert plan.derived == {}
    assert all(tap.pooled_forward is not None for tap in plan.blocks)  # block taps still exact
    full = layer_outputs(deit, x)
    torch.testing.assert_close(layer_outputs(deit, x, ["block01"])["block01"], full["block01"])


def test_timm_resnet_final_and_head_derive_from_the_last_stage(x):
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=3).eval()
    plan = tap_plan(model, "mean")
    assert {tap: parent for tap, (parent, _) in plan.derived.items()} == {
        "final": "stage3",
        "head": "final",
    }
    with torch.no_grad():
        full = layer_outputs(model, x)
        for tap, (parent, fn) in plan.derived.items():
            torch.testing.assert_close(fn(full[parent]), full[tap])


def test_a_resnet_with_max_pooling_gets_no_derived_final():
    model = timm.create_model("resnet18", pretrained=False, global_pool="max").eval()
    assert "final" not in tap_plan(model, "mean").derived


def test_open_clip_modified_resnet_final_is_its_attention_pooled_embedding():
    """Its stem has an ``avgpool`` too: the tap must not take that for the global pooling."""
    from open_clip.modified_resnet import ModifiedResNet

    torch.manual_seed(0)
    model = ModifiedResNet(
        layers=(1, 1, 1, 1), output_dim=24, heads=2, image_size=64, width=8
    ).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        taps = layer_outputs(model, x)
        assert [taps[f"stage{i}"].shape[1] for i in range(4)] == [32, 64, 128, 256]
        torch.testing.assert_close(taps["final"], model(x), rtol=0, atol=0)
    assert "head" not in taps


@pytest.mark.parametrize(("proj", "head_width"), [(None, 24), ("linear", 24), ("none", None)])
def test_open_clip_timm_tower_final_is_the_trunk_embedding_before_the_projection(proj, head_width):
    """EVA02-CLIP's ``timm_proj: null``: open_clip gives the trunk ``num_classes=embed_dim``, so
    the trunk's classifier is the projection: ``final`` stops before it, ``head`` is the tower."""
    from open_clip.timm_model import TimmModel

    torch.manual_seed(0)
    visual = TimmModel("vit_tiny_patch16_224", embed_dim=24, pool="token", proj=proj).eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        taps = layer_outputs(visual, x, ["final", "head"] if head_width else ["final"])
        trunk = visual.trunk
        embedding = trunk.forward_head(trunk.forward_features(x), pre_logits=True)
        torch.testing.assert_close(taps["final"], embedding, rtol=0, atol=0)
        assert taps["final"].shape == (2, 192)
        if head_width:
            assert taps["head"].shape == (2, head_width)
            torch.testing.assert_close(taps["head"], visual(x))
        else:
            assert "head" not in tap_plan(visual).layers
            torch.testing.assert_close(taps["final"], visual(x))
