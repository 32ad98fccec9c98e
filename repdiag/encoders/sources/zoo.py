"""Source ``zoo``: ``<zoo_dir>/<id>/model.safetensors`` + ``meta.json`` written by the zoo stage,
read by the zoo's own loader.

In meta mode the run's architecture is built from its spec in the config (what ``train_zoo``
builds), random weights on the meta device (``zoo run <id> (from its spec)``): no checkpoint is
needed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from repdiag.core.errors import EncoderError
from repdiag.encoders.entries import check_safetensors, model_error
from repdiag.encoders.heads import WithHead
from repdiag.encoders.preprocess import Preprocess
from repdiag.encoders.sources.base import SOURCES, BuildOptions, Built


@SOURCES.register("zoo")
def build_zoo(key: str, entry: Mapping[str, Any], options: BuildOptions) -> Built:
    """The zoo's own loader (``repdiag.encoders.zoo.checkpoint.load_zoo_model``): the timm backbone
    ``timm.create_model(meta.timm_model, **meta.timm_kwargs)`` and the declared head, loaded strictly."""
    if options.meta:
        return _from_spec(key, options.config or {}, str(entry["id"]), options)
    root = options.zoo_dir / str(entry["id"])
    weights_path = root / "model.safetensors"
    for path in (root / "meta.json", weights_path):
        if not path.is_file():
            raise model_error(
                key,
                f"{path} does not exist: train it first (snakemake {weights_path}, rule train_zoo)",
            )
    check_safetensors(weights_path, key)
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    try:
        zoo = load_zoo_model(root, "cpu")
        preprocess = Preprocess(**zoo.meta["preprocess"])
    except (EncoderError, TypeError) as err:
        raise model_error(key, str(err)) from err
    model = zoo.backbone if zoo.head is None else WithHead(zoo.backbone, zoo.head)
    return Built(model, preprocess, pooling=zoo.meta["pooling"], origin=f"zoo run {entry['id']}")


def _from_spec(key: str, config: Mapping[str, Any], run: str, options: BuildOptions) -> Built:
    """The zoo run's architecture from its spec (what ``train_zoo`` builds), random weights."""
    from repdiag.encoders.zoo.backbones import backbone_kwargs, build_backbone, pooling
    from repdiag.encoders.zoo.objectives import OBJECTIVES
    from repdiag.encoders.zoo.scenes import SceneSettings
    from repdiag.encoders.zoo.spec import run_spec

    if run not in ((config.get("zoo") or {}).get("objectives") or {}):
        raise model_error(key, f"zoo run {run!r} is not in zoo.objectives")
    spec = run_spec(config, run)
    cls = OBJECTIVES.get(spec["objective"])
    with options.device():
        kwargs = backbone_kwargs(
            spec["timm_model"], spec["timm_kwargs"], spec["image_size"], cls.backbone_extras
        )
        scenes = SceneSettings.from_config(
            spec["scenes"], spec["image_size"], arrangement_groups=spec["arrangement_groups"]
        )
        objective = cls(build_backbone(spec["timm_model"], kwargs), scenes, **spec["hparams"])
        backbone, head = objective.export()
    model: nn.Module = backbone if head is None else WithHead(backbone, head)
    size = int(spec["image_size"])
    preprocess = Preprocess(size, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bilinear")
    return Built(model, preprocess, pooling(backbone), origin=f"zoo run {run} (from its spec)")
