"""Per-layer pooled taps of an encoder, in depth order, usable inside autograd and ``torch.func``.

Layer names: ``block00``, ``block01``, ... for transformer blocks; ``stage0``, ``stage1``, ... for
CNN stages; ``final`` for the model's own embedding; ``head`` for the projection after it when the
model has one (open_clip's ``visual.proj`` or ``visual.head``, a timm classifier or CLIP projection
when ``num_classes > 0``, a torchvision ``fc``/``heads``/``classifier``, a zoo projection head).

Pooling of a layer's output ``h``:

* tokens ``(N, L, D)`` with ``p`` prefix tokens (class, register): ``cls`` -> ``h[:, 0]``,
  ``mean`` -> ``mean_{t >= p} h[:, t]`` (the mean of the patch tokens);
* feature maps ``(N, C, H, W)``: global average pooling ``mean_{y,x} h[:, :, y, x]`` whatever
  the pooling setting;
* vectors ``(N, D)``: unchanged.

``final`` is what the model itself calls its embedding (timm ``forward_head(pre_logits=True)``,
open_clip's pooled output before ``proj``, torchvision's pooled, flattened features), so it follows
the model's own pooling rather than the ``pooling`` setting.

Block taps are forward hooks that return the pooled output (no in-place ops, no ``.item()``, no
host syncs), and ``final``/``head`` are computed by calling the model's own submodules, so every
tap is differentiable and works under ``torch.func.vjp``/``jvp``/``vmap``. When only block layers
are asked for, the forward pass stops after the deepest one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from repdiag.core.errors import EncoderError
from repdiag.encoders.vit_shortcuts import (
    cls_pooled_forward,
    is_plain_timm_vit_block,
    timm_head,
    timm_vit_derived,
)

POOLINGS = ("cls", "mean")

Pool = Callable[[Any], torch.Tensor]
Run = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]


class _StopForward(Exception):
    """Raised by the deepest requested block's hook to skip the rest of the forward pass."""


@dataclasses.dataclass
class BlockTap:
    """A hooked block: ``pool(block output)`` is the tap.

    ``pooled_forward(block, block_input)``, when set, computes the tap directly from the block's
    input with only the rows the pooling reads (the class token of a transformer block): used for
    the deepest block of a pass that stops there, such as a Jacobian of one block's tap.
    """

    name: str
    module: nn.Module
    pool: Pool
    pooled_forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None


@dataclasses.dataclass
class TapPlan:
    """Where the taps of one model are: hooked blocks/stages, and how to compute final and head.

    ``run(x, want_head) -> (final, head or None)`` runs the whole model once. ``derived`` maps a
    tap to ``(parent, fn)`` when the tap is ``fn(parent tap)`` row by row (``final`` of a
    class-token ViT is the final norm of the last block's class token; a linear ``head`` is a
    function of ``final``): the Jacobian engine then gets its Jacobian by the chain rule.
    """

    blocks: list[BlockTap]
    run: Run
    has_head: bool
    kind: str
    derived: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = dataclasses.field(
        default_factory=dict
    )
    head_name: str = "head"  # "projection" for MAE's decoder_embed (repdiag.encoders.vit_shortcuts)

    @property
    def layers(self) -> list[str]:
        return [tap.name for tap in self.blocks] + ["final"] + ([self.head_name] * self.has_head)


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def _pool_tokens(tokens: torch.Tensor, pooling: str, num_prefix: int) -> torch.Tensor:
    if pooling == "cls":
        if num_prefix < 1:
            raise EncoderError(
                "pooling 'cls' needs a class token but this model has none: set pooling: mean"
            )
        return tokens[:, 0]
    return tokens[:, num_prefix:].mean(dim=1)


def pool_output(
    output: Any, pooling: str = "cls", num_prefix: int = 1, channels_last: bool = False
) -> torch.Tensor:
    """Pool a module output to ``(N, D)`` by its rank (tokens, feature map or vector)."""
    h = _first(output)
    if h.ndim == 2:
        return h
    if h.ndim == 3:
        return _pool_tokens(h, pooling, num_prefix)
    if h.ndim == 4:
        return h.mean(dim=(1, 2) if channels_last else (2, 3))
    return h.flatten(1)


def _pooler(
    pooling: str, num_prefix: int, batch_first: bool = True, channels_last: bool = False
) -> Pool:
    def pool(output: Any) -> torch.Tensor:
        h = _first(output)
        if h.ndim == 3 and not batch_first:
            h = h.transpose(0, 1)
        return pool_output(h, pooling, num_prefix, channels_last)

    return pool


def _block_names(prefix: str, count: int, width: int = 2) -> list[str]:
    width = max(width, len(str(count - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def _stage_names(count: int) -> list[str]:
    return _block_names("stage", count, width=1)


def _has_parameters(module: nn.Module | None) -> bool:
    return module is not None and any(True for _ in module.parameters())


def _mro_names(model: nn.Module) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(model).__mro__]


def _is(model: nn.Module, *names: str) -> bool:
    """True when the model's class or a base class has one of these qualified names or prefixes."""
    return any(
        full == name or full.startswith(name + ".") for full in _mro_names(model) for name in names
    )


def _check_cls(pooling: str, has_cls: bool, what: str) -> None:
    if pooling == "cls" and not has_cls:
        raise EncoderError(
            f"{what} has no class token, so pooling 'cls' is undefined: set pooling: mean"
        )


# --- timm ----------------------------------------------------------------------------------


def _timm_stage_modules(model: nn.Module) -> list[nn.Module]:
    """CNN stages from timm's ``feature_info``, the stem (reduction < 4) left out."""
    modules = []
    for info in getattr(model, "feature_info", []) or []:
        if info.get("reduction", 4) < 4:
            continue
        name = info["module"]
        try:
            modules.append(model.get_submodule(name))
        except AttributeError:
            modules.append(model.get_submodule(name.replace("_", ".")))
    return modules


def _same_rows(v: torch.Tensor) -> torch.Tensor:
    return v


def _final_is_last_stage_mean(model: nn.Module, last_stage: nn.Module) -> bool:
    """timm's ``ResNet`` with average pooling: ``forward_features`` ends with ``layer4`` and
    ``forward_head(pre_logits=True)`` is its global average, so ``final`` is the last stage's tap
    (whose Jacobian the engine then reuses instead of differentiating the network again)."""
    pool = getattr(model, "global_pool", None)
    return (
        _is(model, "timm.models.resnet.ResNet")
        and last_stage is getattr(model, "layer4", None)
        and getattr(pool, "pool_type", None) == "avg"
        and not getattr(model, "grad_checkpointing", False)
    )


def _timm_plan(model: nn.Module, pooling: str) -> TapPlan:
    derived: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {}
    head_name, has_head = timm_head(model)
    if hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens"):
        has_cls = getattr(model, "cls_token", None) is not None
        _check_cls(pooling, has_cls, f"timm model {type(model).__name__}")
        pool = _pooler(pooling, int(model.num_prefix_tokens))
        modules = list(model.blocks)
        shortcut = pooling == "cls" and all(is_plain_timm_vit_block(m) for m in modules)
        blocks = [
            BlockTap(n, m, pool, cls_pooled_forward if shortcut else None)
            for n, m in zip(_block_names("block", len(modules)), modules, strict=True)
        ]
        if shortcut and blocks:
            derived = timm_vit_derived(model, blocks[-1].name, has_head, head_name)
    else:
        channels_last = getattr(model, "output_fmt", "NCHW") == "NHWC"
        pool = _pooler(pooling, 0, channels_last=channels_last)
        modules = _timm_stage_modules(model)
        blocks = [
            BlockTap(n, m, pool) for n, m in zip(_stage_names(len(modules)), modules, strict=True)
        ]
        if blocks and _final_is_last_stage_mean(model, modules[-1]):
            derived["final"] = (blocks[-1].name, _same_rows)
            if has_head and isinstance(model.fc, nn.Linear):
                derived["head"] = ("final", model.fc)
    num_prefix = int(getattr(model, "num_prefix_tokens", 0))

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        features = model.forward_features(x)
        final = pool_output(model.forward_head(features, pre_logits=True), pooling, num_prefix)
        head = model.forward_head(features) if want_head and has_head else None
        return final, head

    return TapPlan(blocks, run, has_head, f"timm {type(model).__name__}", derived, head_name)


# --- open_clip -----------------------------------------------------------------------------


def _open_clip_vit_plan(visual: nn.Module, pooling: str) -> TapPlan:
    pool = _pooler(pooling, 1, batch_first=getattr(visual.transformer, "batch_first", True))
    modules = list(visual.transformer.resblocks)
    blocks = [
        BlockTap(n, m, pool)
        for n, m in zip(_block_names("block", len(modules)), modules, strict=True)
    ]
    has_head = visual.proj is not None

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        pooled, _ = visual._pool(visual.transformer(visual._embeds(x)))
        return pooled, (pooled @ visual.proj if want_head and has_head else None)

    return TapPlan(blocks, run, has_head, "open_clip VisionTransformer")


def _open_clip_timm_plan(visual: nn.Module, pooling: str) -> TapPlan:
    """``final``: the trunk's pooled pre-logits embedding; ``head``: open_clip's projection.

    Without ``timm_proj`` (EVA02-CLIP), open_clip builds the trunk with ``num_classes=embed_dim``:
    the trunk's own classifier is then the projection, so ``final`` stops before it and ``head``
    includes it (then ``visual.head``, empty there)."""
    trunk = visual.trunk
    trunk_plan = _timm_plan(trunk, pooling)
    trunk_projects = int(getattr(trunk, "num_classes", 0) or 0) > 0
    has_head = trunk_projects or _has_parameters(visual.head)
    num_prefix = int(getattr(trunk, "num_prefix_tokens", 0))

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        features = trunk.forward_features(x)
        pooled = trunk.forward_head(features, pre_logits=True)
        head = None
        if want_head and has_head:
            head = visual.head(trunk.forward_head(features) if trunk_projects else pooled)
        return pool_output(pooled, pooling, num_prefix), head

    return TapPlan(trunk_plan.blocks, run, has_head, f"open_clip TimmModel ({trunk_plan.kind})")


# --- torchvision and ResNet-like (torch.hub ResNet-50s, open_clip ModifiedResNet) --------------


def _torchvision_vit_plan(model: nn.Module, pooling: str) -> TapPlan:
    pool = _pooler(pooling, 1)
    modules = list(model.encoder.layers)
    blocks = [
        BlockTap(n, m, pool)
        for n, m in zip(_block_names("block", len(modules)), modules, strict=True)
    ]

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens = model._process_input(x)
        cls = model.class_token.expand(tokens.shape[0], -1, -1)
        final = model.encoder(torch.cat([cls, tokens], dim=1))[:, 0]
        return final, (model.heads(final) if want_head else None)

    return TapPlan(blocks, run, True, "torchvision VisionTransformer")


def _torchvision_convnext_plan(model: nn.Module, pooling: str) -> TapPlan:
    stages = [
        m
        for m in model.features
        if isinstance(m, nn.Sequential) and any(type(c).__name__ == "CNBlock" for c in m)
    ]
    pool = _pooler(pooling, 0)
    blocks = [BlockTap(n, m, pool) for n, m in zip(_stage_names(len(stages)), stages, strict=True)]
    pre_logits, classifier = model.classifier[:-1], model.classifier[-1]

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        final = pre_logits(model.avgpool(model.features(x)))
        return final, (classifier(final) if want_head else None)

    return TapPlan(blocks, run, True, "torchvision ConvNeXt")


def _resnet_like_plan(model: nn.Module, pooling: str) -> TapPlan:
    stages = [getattr(model, f"layer{i}") for i in range(1, 5)]
    pool = _pooler(pooling, 0)
    blocks = [BlockTap(n, m, pool) for n, m in zip(_stage_names(4), stages, strict=True)]
    # The global pooling before fc (torchvision, torch.hub ResNets). open_clip's ModifiedResNet has
    # an ``avgpool`` too, but in its stem (anti-aliased downsampling): its embedding is attnpool's.
    avgpool = getattr(model, "avgpool", None)
    if not isinstance(avgpool, nn.AdaptiveAvgPool2d) or hasattr(model, "attnpool"):
        avgpool = None
    has_head = avgpool is not None and _has_parameters(getattr(model, "fc", None))

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if avgpool is None:  # e.g. open_clip ModifiedResNet: attention pooling is the embedding
            return pool_output(model(x), pooling, 0), None
        captured: dict[str, torch.Tensor] = {}

        def keep(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            captured["pooled"] = output

        handle = avgpool.register_forward_hook(keep)
        try:
            out = model(x)
        finally:
            handle.remove()
        return captured["pooled"].flatten(1), (_first(out) if want_head and has_head else None)

    return TapPlan(blocks, run, has_head, f"ResNet-like {type(model).__name__}")


def _features_classifier_plan(model: nn.Module, pooling: str) -> TapPlan:
    has_head = _has_parameters(model.classifier)

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        final = model.avgpool(model.features(x)).flatten(1)
        return final, (model.classifier(final) if want_head and has_head else None)

    return TapPlan([], run, has_head, f"features/avgpool/classifier {type(model).__name__}")


# --- generic modules (python: encoders) ---------------------------------------------------------


def _generic_plan(model: nn.Module, pooling: str) -> TapPlan:
    num_prefix = int(
        getattr(
            model, "num_prefix_tokens", 1 if getattr(model, "cls_token", None) is not None else 0
        )
    )
    blocks: list[BlockTap] = []
    container = getattr(model, "blocks", None)
    if isinstance(container, (nn.ModuleList, nn.Sequential)):
        pool = _pooler(pooling, num_prefix)
        modules = list(container)
        blocks = [
            BlockTap(n, m, pool)
            for n, m in zip(_block_names("block", len(modules)), modules, strict=True)
        ]

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return pool_output(model(x), pooling, num_prefix), None

    return TapPlan(blocks, run, False, f"module {type(model).__name__}")


def _with_head_plan(model: nn.Module, pooling: str) -> TapPlan:
    inner = tap_plan(model.backbone, pooling)

    def run(x: torch.Tensor, want_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        final, _ = inner.run(x, False)
        return final, (model.head(final) if want_head else None)

    derived = {**inner.derived, "head": ("final", model.head)}  # the head reads final only
    return TapPlan(inner.blocks, run, True, f"{inner.kind} + projection head", derived)


def _open_clip_visual(model: nn.Module) -> nn.Module | None:
    if _is(
        model, "open_clip.model.CLIP", "open_clip.model.CustomTextCLIP", "open_clip.coca_model.CoCa"
    ):
        return model.visual
    return None


_PLANS: tuple[tuple[Callable[[nn.Module], bool], Callable[[nn.Module, str], TapPlan]], ...] = (
    (lambda m: _is(m, "repdiag.encoders.heads.WithHead"), _with_head_plan),
    (lambda m: _open_clip_visual(m) is not None, lambda m, p: tap_plan(_open_clip_visual(m), p)),
    (lambda m: _is(m, "open_clip.transformer.VisionTransformer"), _open_clip_vit_plan),
    (lambda m: _is(m, "open_clip.timm_model.TimmModel"), _open_clip_timm_plan),
    (lambda m: _is(m, "timm.models"), _timm_plan),
    (
        lambda m: _is(m, "torchvision.models.vision_transformer.VisionTransformer"),
        _torchvision_vit_plan,
    ),
    (lambda m: _is(m, "torchvision.models.convnext.ConvNeXt"), _torchvision_convnext_plan),
    (lambda m: all(hasattr(m, f"layer{i}") for i in range(1, 5)), _resnet_like_plan),
    (
        lambda m: all(
            isinstance(getattr(m, a, None), nn.Module)
            for a in ("features", "avgpool", "classifier")
        ),
        _features_classifier_plan,
    ),
)


def tap_plan(model: nn.Module, pooling: str = "cls") -> TapPlan:
    """The taps of ``model``: recognised by architecture (timm, open_clip, torchvision, ResNet-like)
    or, for any other module, its ``blocks`` (if it has them) and its output as ``final``."""
    if pooling not in POOLINGS:
        raise EncoderError(f"pooling {pooling!r} is not one of {POOLINGS}")
    for matches, build in _PLANS:
        if matches(model):
            return build(model, pooling)
    return _generic_plan(model, pooling)


def run_taps(
    plan: TapPlan, x: torch.Tensor, layers: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """Pooled outputs ``{layer: (N, D_layer)}`` of ``plan``'s model on preprocessed ``x``, in depth order."""
    names = plan.layers
    wanted = set(names if layers is None else layers)
    unknown = sorted(wanted - set(names))
    if unknown:
        raise EncoderError(f"unknown layers {unknown} for {plan.kind}; its layers are {names}")
    need_run = "final" in wanted or plan.head_name in wanted
    taps = [tap for tap in plan.blocks if tap.name in wanted]
    deepest = None if need_run or not taps else taps[-1].name
    captured: dict[str, torch.Tensor] = {}

    def hook_for(tap: BlockTap) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            captured[tap.name] = tap.pool(output)
            if tap.name == deepest:
                raise _StopForward

        return hook

    def pre_hook_for(tap: BlockTap) -> Callable[[nn.Module, Any], None]:
        def pre_hook(module: nn.Module, args: Any) -> None:
            captured[tap.name] = tap.pooled_forward(module, args[0])
            raise _StopForward

        return pre_hook

    handles = []
    for tap in taps:
        if tap.name == deepest and tap.pooled_forward is not None:
            handles.append(tap.module.register_forward_pre_hook(pre_hook_for(tap)))
        else:
            handles.append(tap.module.register_forward_hook(hook_for(tap)))
    try:
        if need_run:
            captured["final"], head = plan.run(x, plan.head_name in wanted)
            if head is not None:
                captured[plan.head_name] = pool_output(head)
        elif taps:
            try:
                plan.run(x, False)
            except _StopForward:
                pass
    finally:
        for handle in handles:
            handle.remove()
    return {name: captured[name] for name in names if name in wanted}


def layer_outputs(
    model: Any,
    images: torch.Tensor,
    layers: Iterable[str] | None = None,
    *,
    pooling: str | None = None,
) -> dict[str, torch.Tensor]:
    """``{layer: Tensor (N, D_layer)}`` for an :class:`~repdiag.encoders.Encoder` or any ``nn.Module``.

    ``images`` are preprocessed ``(N, 3, S, S)``. For an Encoder its own pooling is used and
    ``pooling`` must be None or equal to it; for a plain module ``pooling`` defaults to ``cls``.
    Differentiable; usable inside ``torch.func`` transforms.
    """
    plan = getattr(model, "plan", None)
    if isinstance(plan, TapPlan):
        if pooling is not None and pooling != model.pooling:
            raise EncoderError(
                f"encoder {model.key!r} pools with {model.pooling!r}; build it with pooling {pooling!r} instead"
            )
        return run_taps(plan, images, layers)
    return run_taps(tap_plan(model, pooling or "cls"), images, layers)
