"""Shortcuts for timm's own ViT in the tap plan (repdiag.encoders.taps): a block's class-token
row computed alone, and ``final``/``head`` as functions of the last block's class token, both
used only where they equal the model's own forward exactly; and MAE's projection tap.

The projection tap of an MAE (He et al. 2022, "Masked autoencoders are scalable vision
learners"; ``models_mae.py``): ``decoder_embed``, the linear map (``embed_dim`` -> 512) that
projects the encoder's final-normed tokens into the decoder. The binding paper finds MAE's rank
high through the backbone and collapsing at this projection layer. Here it is the tap
``projection`` = ``decoder_embed(final)`` (the class token's projection under ``cls`` pooling; a
linear map commutes with mean pooling), after ``final``. timm's ``*.mae`` weights hold the
encoder only, so the tap exists with random weights (architecture, planner, tests) or when the
weights file holds ``decoder_embed.*`` (the official ``*_full`` checkpoints); with timm's own
weights it is left out rather than given a random projection.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def is_plain_timm_vit_block(block: nn.Module) -> bool:
    """timm's own ViT ``Block`` with its own ``Attention`` (the forward ``cls_token_block`` mirrors)."""
    from timm.models import vision_transformer as vit

    attn = getattr(block, "attn", None)
    return (
        type(block) is vit.Block
        and type(attn) is vit.Attention
        and isinstance(attn.qkv, nn.Linear)
        and not attn.qkv.weight.shape[0] % 3
    )


def cls_token_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``block(x)[:, 0]`` for a timm ViT block in eval mode, computing only the class-token rows.

    The class token's output needs the keys and values of every token but the query, attention
    output, projection and MLP of token 0 only: about 1/5 of the block's FLOPs at 65 tokens, and
    the backward pass shrinks alike. Same maths as ``Block.forward``/``Attention.forward`` (timm 1.0).
    """
    attn = block.attn
    batch, tokens = x.shape[:2]
    h = block.norm1(x)
    weight, bias = attn.qkv.weight, attn.qkv.bias
    dim = weight.shape[0] // 3
    q_bias, kv_bias = (None, None) if bias is None else (bias[:dim], bias[dim:])
    q = nn.functional.linear(h[:, :1], weight[:dim], q_bias)
    kv = nn.functional.linear(h, weight[dim:], kv_bias)
    q = q.reshape(batch, 1, attn.num_heads, attn.head_dim).transpose(1, 2)
    k, v = kv.reshape(batch, tokens, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    out = nn.functional.scaled_dot_product_attention(q, k, v)
    out = attn.norm(out.transpose(1, 2).reshape(batch, 1, dim))
    if getattr(attn, "gate", None) is not None:
        out = out * attn.gate(h[:, :1]).sigmoid()
    y = x[:, :1] + block.drop_path1(block.ls1(attn.proj_drop(attn.proj(out))))
    y = y + block.drop_path2(block.ls2(block.mlp(block.norm2(y))))
    return y[:, 0]


def cls_pooled_forward(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if block.training or x.ndim != 3:  # dropout/drop-path draws would differ: run the block
        return block.forward(x)[:, 0]  # .forward: not through this pre-hook again
    return cls_token_block(block, x)


MAE_DECODER_DIM = 512  # decoder width of the MAE ViT-B/L/H models (He et al. 2022)
MAE_DECODER_KEYS = ("decoder_", "mask_token")  # the decoder's part of a full MAE checkpoint


def is_timm_mae(model: nn.Module) -> bool:
    """A timm ViT of an MAE pretrained config (``vit_*_patch16_224.mae``)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return cfg.get("tag") == "mae" and hasattr(model, "blocks") and hasattr(model, "embed_dim")


def split_mae_decoder(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(the encoder's part of ``state``, ``decoder_embed``'s weight and bias or ``None``)."""
    encoder = {k: v for k, v in state.items() if not k.startswith(MAE_DECODER_KEYS)}
    if "decoder_embed.weight" not in state:
        return encoder, None
    return encoder, {"weight": state["decoder_embed.weight"], "bias": state["decoder_embed.bias"]}


def attach_mae_projection(model: nn.Module, weights: dict[str, torch.Tensor] | None) -> None:
    """Give ``model`` MAE's ``decoder_embed`` as its head, read as the tap ``projection``:
    ``weights`` (from the checkpoint) or, when ``None``, random as the model's own are."""
    device = next(model.parameters()).device
    projection = nn.Linear(int(model.embed_dim), MAE_DECODER_DIM, device=device)
    if weights is not None:
        projection.load_state_dict(weights)
    model.head = projection
    model.mae_projection = True


def timm_head(model: nn.Module) -> tuple[str, bool]:
    """(the name of the tap after ``final``, whether there is one): ``projection`` for an MAE
    given its :func:`attach_mae_projection`, else ``head`` when timm has a classifier."""
    if getattr(model, "mae_projection", False):
        return "projection", True
    return "head", int(getattr(model, "num_classes", 0) or 0) > 0


def timm_vit_derived(
    model: nn.Module, last_block: str, has_head: bool, head_name: str = "head"
) -> dict:
    """``final`` (and a linear ``head``) as functions of the last block's class token, when exact:
    timm's own ``VisionTransformer`` (subclasses such as DeiT-distilled pool other tokens too)
    pooling the class token, a per-token final norm and no attention pooling. The block taps
    must pool the class token too (the caller's ``pooling == "cls"``)."""
    from timm.models import vision_transformer as vit

    exact = (
        type(model) is vit.VisionTransformer
        and model.global_pool == "token"
        and model.attn_pool is None
        and isinstance(model.norm, nn.LayerNorm | nn.Identity)
    )
    if not exact:
        return {}
    derived: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
        "final": (
            last_block,
            lambda cls: model.forward_head(model.norm(cls[:, None]), pre_logits=True),
        )
    }
    if has_head and isinstance(model.head, nn.Linear):
        derived[head_name] = ("final", model.head)
    return derived
