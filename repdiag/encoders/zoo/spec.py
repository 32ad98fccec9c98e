"""The zoo section of the config: which runs to train and the complete settings of each.

Imported while Snakemake parses the workflow, so it must not import torch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from repdiag.common.families import (
    BINDING_DOSE_FAMILY,
    BINDING_SUPERVISED_FAMILY,
    CONTROL_FAMILY,
    JER_INTERVENTION_FAMILY,
)
from repdiag.core.errors import ConfigError
from repdiag.encoders.entries import check_timm_name, remote_names, weights_kwargs

FAMILIES: dict[str, str] = {
    "barlow_twins": "variance_decorrelation",
    "vicreg": "variance_decorrelation",
    "mae": "masked_modeling",
    "simmim": "masked_modeling",
    "dino": "clustering_distillation",
    "simclr": "contrastive",
    "clip": "vision_language",
    "supervised": "supervised",
}
"""Objective -> the paper's objective family (the ``family`` of models using it)."""

VIT_ONLY = frozenset({"mae"})  # masking drops patch tokens: needs a patch-token transformer
CNN_ONLY = frozenset({"simmim"})  # decodes the backbone's (B, C, h, w) feature map
VIT_MARKERS = ("vit", "deit")  # timm names of plain ViTs (class token + absolute positions)


# Types of timm's architecture keywords, checked on every parse without importing timm: a wrong
# type fails deep in timm when the job builds the backbone (``depth: two``), or silently builds
# another width (``mlp_ratio: "2"`` repeats a string). The pre-run check
# (``repdiag.encoders.zoo.prerun.check_zoo_backbones``) builds each backbone for the rest.
TIMM_KWARG_TYPES: dict[str, str] = {
    **dict.fromkeys(
        (
            "depth", "depths", "embed_dim", "embed_dims", "num_heads", "patch_size", "img_size",
            "in_chans", "num_classes", "channels", "layers", "dims", "widths", "stem_width",
            "cardinality", "base_width", "reg_tokens", "output_stride",
        ),
        "an integer or a list of integers",
    ),
    **dict.fromkeys(
        (
            "mlp_ratio", "drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate",
            "pos_drop_rate", "patch_drop_rate", "init_values", "layer_scale_init_value",
        ),
        "a number (or null)",
    ),
    **dict.fromkeys(
        ("class_token", "qkv_bias", "qk_norm", "no_embed_class", "dynamic_img_size", "pre_norm"),
        "true or false",
    ),
}  # fmt: skip


def _timm_type_ok(kind: str, value: Any) -> bool:
    def integer(item: Any) -> bool:
        return isinstance(item, int) and not isinstance(item, bool)

    if kind.startswith("an integer"):
        return integer(value) or (isinstance(value, list) and all(map(integer, value)))
    if kind.startswith("a number"):
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    return isinstance(value, bool)


def check_timm_kwarg_types(where: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a known timm keyword of the wrong type (:data:`TIMM_KWARG_TYPES`), naming
    ``where.<keyword>``."""
    for name, value in kwargs.items():
        kind = TIMM_KWARG_TYPES.get(str(name))
        if kind is not None and not _timm_type_ok(kind, value):
            raise ConfigError(
                f"{where}.{name}: expected {kind}, got {value!r}; timm builds the backbone "
                "with this value"
            )


def zoo_runs_of(models: Mapping[str, Any]) -> list[str]:
    """The zoo runs (``id``) of the ``models`` with ``source: zoo``, sorted, each once."""
    return sorted({entry["id"] for entry in models.values() if entry.get("source") == "zoo"})


def zoo_models_of(models: Mapping[str, Any]) -> list[str]:
    """The keys of the ``models`` with ``source: zoo`` (trained by the workflow), sorted."""
    return sorted(key for key, entry in models.items() if entry.get("source") == "zoo")


def zoo_files(models: Mapping[str, Any], keys: Iterable[str], name: str) -> list[str]:
    """``results/zoo/<run>/<name>`` of each zoo model among ``keys`` (``models``: the config's),
    in the order of ``keys``, one per model (scripts pair them with the keys; two models of one
    run give its file twice). For each run's file once, :func:`zoo_runs_of`."""
    zoo = [key for key in keys if models[key].get("source") == "zoo"]
    return [f"results/zoo/{models[key]['id']}/{name}" for key in zoo]


def zoo_runs(config: Mapping[str, Any]) -> list[str]:
    """The runs to train: :func:`zoo_runs_of` every model of the config."""
    return zoo_runs_of(config.get("models") or {})


REGULARISER_TERMS = ("jer", "global_pr", "direction_sham")
"""What can push a run (``jer_regulariser.term``; repdiag.encoders.zoo.regulariser)."""

DEFAULT_TERM = "jer"
"""``jer_regulariser.term`` where a run leaves it out. Its one home: the schema gives it no
default on purpose (a plain run's resolved spec, its jobs' params, stays as it was before the
key existed), and the regulariser and the causal test's checks and tables read it here."""

NULL_MAX_WEIGHT = 1e-6
"""The largest |weight| of a null push (``jer_regulariser``): one that changes a run only
through rounding, so its effect is training's chaos, not the term's aim (binding_causal's null
arm, the dose series' replicate). Such a run stays in the dose series
(repdiag.binding.analysis.aggregate.dose_of)."""


def saved_parent(config: Mapping[str, Any], run: str) -> str | None:
    """The run whose ``save_at`` declared ``run`` (its training writes it), else None."""
    return ((config.get("zoo") or {}).get("objectives") or {}).get(run, {}).get("saved_by")


def trained_runs(config: Mapping[str, Any]) -> list[str]:
    """The runs to train (sorted): :func:`zoo_runs`, a saved step replaced by its run."""
    return sorted({saved_parent(config, run) or run for run in zoo_runs(config)})


def saved_runs(config: Mapping[str, Any]) -> list[str]:
    """The zoo runs that a model uses and another run's training saves (``save_at``)."""
    return [run for run in zoo_runs(config) if saved_parent(config, run)]


def saving_runs(config: Mapping[str, Any]) -> list[str]:
    """The runs to train that also save steps: their job writes ``saved/step<t>/``."""
    return [run for run in trained_runs(config) if run_spec(config, run).get("save_at")]


def pushed_runs(config: Mapping[str, Any]) -> list[str]:
    """The zoo runs with a regulariser (``jer_regulariser.weight`` != 0): their training job
    also writes the cumulative push, ``push.safetensors`` (repdiag.encoders.zoo.regulariser)."""
    return [
        run
        for run in trained_runs(config)
        if float((run_spec(config, run).get("jer_regulariser") or {}).get("weight") or 0.0)
    ]


def objective_of(name: str, entry: Mapping[str, Any]) -> str:
    """The objective of run ``name``: its ``objective`` key, else the name itself."""
    return entry.get("objective") or name


def tells_binding(objective: str, hparams: Mapping[str, Any]) -> bool:
    """Whether the run's training signal states which shape sits in which slot (fully)."""
    return (objective == "supervised" and hparams.get("label") == "slot_shape") or (
        objective == "clip" and hparams.get("captions") == "relational"
    )


def binding_dose(objective: str, hparams: Mapping[str, Any]) -> float:
    """The run's binding dose lambda: the weight of the slot labels beside the presence labels
    (``zoo.hparams.supervised.slot_weight``); 0 for every other run."""
    if objective != "supervised" or hparams.get("label", "shape_presence") != "shape_presence":
        return 0.0
    return float(hparams.get("slot_weight") or 0.0)


def run_family(
    name: str, entry: Mapping[str, Any], hparams: Mapping[str, Mapping[str, Any]]
) -> str:
    """The family of the models of run ``name``: ``control`` for 0 steps, ``binding_supervised``
    when its labels or captions state the binding, ``jer_intervention`` when its JER is
    regularised (at any dose), ``binding_dose`` when a presence run is told the slots at a dose
    lambda > 0, else its objective's family."""
    objective = objective_of(name, entry)
    effective = {**(hparams.get(objective) or {}), **(entry.get("hparams") or {})}
    if entry.get("steps") == 0:
        return CONTROL_FAMILY
    if tells_binding(objective, effective):
        return BINDING_SUPERVISED_FAMILY
    if (entry.get("jer_regulariser") or {}).get("weight"):
        return JER_INTERVENTION_FAMILY
    if binding_dose(objective, effective) > 0:
        return BINDING_DOSE_FAMILY
    return FAMILIES[objective]


def _check_hparams(where: str, overrides: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if key not in defaults:
            raise ConfigError(
                f"{where}.{key}: unknown hyperparameter; known: {', '.join(sorted(defaults))}"
            )
        default = defaults[key]
        kinds: tuple[type, ...] = (
            (int, float) if isinstance(default, int | float) else (type(default),)
        )
        if isinstance(default, bool):
            kinds = (bool,)
        if not isinstance(value, kinds) or (
            isinstance(value, bool) and not isinstance(default, bool)
        ):
            raise ConfigError(
                f"{where}.{key}: expected {type(default).__name__} like the default {default!r}, got {value!r}"
            )


def _check_widths(where: str, objective: str, hparams: Mapping[str, Any]) -> None:
    """Attention widths must split into heads; MAE's sine-cosine table needs a multiple of 4."""
    pairs = {"mae": ("decoder_dim", "decoder_heads"), "clip": ("text_width", "text_heads")}
    if objective in pairs:
        width, heads = pairs[objective]
        if hparams[width] % hparams[heads]:
            raise ConfigError(
                f"{where}: {width} ({hparams[width]}) must be a multiple of {heads} "
                f"({hparams[heads]}); see zoo.hparams.{objective}"
            )
    if objective == "mae" and hparams["decoder_dim"] % 4:
        raise ConfigError(
            f"{where}: decoder_dim ({hparams['decoder_dim']}) must be a multiple of 4"
        )


def _check_dose(name: str, entry: Mapping[str, Any], hparams: Mapping[str, Any]) -> None:
    """A dose of slot labels (slot_weight > 0) is added to presence labels only."""
    if objective_of(name, entry) != "supervised":
        return
    effective = {**(hparams.get("supervised") or {}), **(entry.get("hparams") or {})}
    label = effective.get("label", "shape_presence")
    if effective.get("slot_weight") and label != "shape_presence":
        raise ConfigError(
            f"zoo.objectives.{name}.hparams.slot_weight: a dose of slot labels is added to "
            f"presence labels; set label: shape_presence (got {label!r}) or slot_weight: 0"
        )


def _check_backbones(backbones: Mapping[str, Any], used: set[str]) -> None:
    """Names of the backbones runs use, types of known timm keywords, no weights or remote files."""
    for name, backbone in backbones.items():
        if name in used:  # a backbone no run names is never built
            check_timm_name(f"zoo.backbones.{name}.timm_model", str(backbone["timm_model"]))
        where = f"zoo.backbones.{name}.timm_kwargs"
        check_timm_kwarg_types(where, backbone.get("timm_kwargs") or {})
        bad = weights_kwargs(backbone.get("timm_kwargs") or {}, where)
        bad += remote_names(backbone.get("timm_kwargs") or {}, where)
        if bad:
            raise ConfigError(
                f"{bad[0]}: a zoo backbone is built from random weights and trained here; "
                "keyword arguments that load, cache, download or name weights or remote files "
                "are refused (timm would open them itself)"
            )


def _check_scenes(scenes: Mapping[str, Any]) -> None:
    """Objects fit the grid and their cells."""
    grid = scenes.get("grid", [3, 3])
    slots = grid[0] * grid[1]
    if not scenes.get("min_objects", 2) <= scenes.get("max_objects", 6) <= slots:
        raise ConfigError(
            f"zoo.scenes: need min_objects <= max_objects <= rows * cols = {slots} "
            f"(got {scenes.get('min_objects', 2)}, {scenes.get('max_objects', 6)})"
        )
    size = scenes.get("object_size", 0.7) * (1 + (scenes.get("jitter") or {}).get("scale", 0.3))
    if size > 1 + 1e-12:
        raise ConfigError(
            f"zoo.scenes.object_size * (1 + zoo.scenes.jitter.scale) = {size:.3f} > 1: objects "
            "would leave their cells; lower one of them"
        )


def check_zoo_config(config: Mapping[str, Any]) -> None:
    """Cross-key checks of the zoo (registered in ``repdiag.encoders.config_checks()``).

    Every model with ``source: zoo`` names a run of ``zoo.objectives`` whose objective's family is
    the model's ``family``; every run names a known backbone (a ViT for mae) and valid overrides.
    """
    zoo = config.get("zoo") or {}
    objectives = zoo.get("objectives") or {}
    backbones = zoo.get("backbones") or {}
    hparams = zoo.get("hparams") or {}
    _check_backbones(backbones, {entry.get("backbone", "resnet") for entry in objectives.values()})
    for name, entry in objectives.items():
        _check_dose(name, entry, hparams)
    for key, entry in (config.get("models") or {}).items():
        if entry.get("source") != "zoo":
            continue
        run = entry.get("id")
        if run not in objectives:
            raise ConfigError(
                f"models.{key}.id: zoo run {run!r} is not defined in zoo.objectives "
                f"(defined: {', '.join(sorted(objectives)) or 'none'}); add it there or fix the id"
            )
        expected = run_family(run, objectives[run], hparams)
        if entry.get("family") != expected:
            why = {
                CONTROL_FAMILY: "has steps: 0 (the random-initialised network), so it is a control",
                BINDING_SUPERVISED_FAMILY: "is told the benchmark's answer (slot_shape labels or "
                "relational captions), so it is an upper bound outside the families",
                BINDING_DOSE_FAMILY: "is told the slot labels at a dose (slot_weight > 0), so it "
                "belongs to the binding dose series outside the families",
                JER_INTERVENTION_FAMILY: "has its JER regularised (jer_regulariser.weight != 0), "
                "so it is an intervention compared with its own unregularised run",
            }.get(expected, f"trains a {expected} objective")
            raise ConfigError(
                f"models.{key}.family: zoo run {run!r} {why}, but the model says "
                f"{entry.get('family')!r}; set family: {expected}"
            )
    for name, entry in objectives.items():
        where = f"zoo.objectives.{name}"
        objective = objective_of(name, entry)
        if objective not in FAMILIES:
            raise ConfigError(
                f"{where}: the run name is not an objective, so set objective: to one of "
                f"{', '.join(sorted(FAMILIES))}"
            )
        backbone = entry.get("backbone", "resnet")
        if backbone not in backbones:
            raise ConfigError(
                f"{where}.backbone: {backbone!r} is not in zoo.backbones ({', '.join(sorted(backbones))})"
            )
        timm_model = backbones[backbone]["timm_model"].lower()
        if objective in CNN_ONLY and any(m in timm_model for m in VIT_MARKERS):
            raise ConfigError(
                f"{where}.backbone: {objective} decodes a feature map and needs a ConvNet "
                f"backbone, got {backbones[backbone]['timm_model']!r} (use mae for a ViT)"
            )
        if objective in VIT_ONLY and not any(m in timm_model for m in VIT_MARKERS):
            raise ConfigError(
                f"{where}.backbone: {objective} masks patch tokens and needs a ViT backbone, "
                f"got {backbones[backbone]['timm_model']!r}"
            )
        stop_at = entry.get("stop_at")
        if stop_at is not None and stop_at > entry["steps"]:  # defaults filled: the schema's
            raise ConfigError(
                f"{where}.stop_at: {stop_at} is past the run's steps ({entry['steps']}); "
                "a checkpoint stops at or before the last step"
            )
        _check_hparams(f"{where}.hparams", entry.get("hparams") or {}, hparams.get(objective, {}))
        _check_widths(
            where, objective, {**hparams.get(objective, {}), **(entry.get("hparams") or {})}
        )
    _check_scenes(zoo.get("scenes") or {})


def run_spec(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Everything run ``name`` depends on, resolved to plain values (the rule's ``params``)."""
    zoo = config["zoo"]
    entry = zoo["objectives"][name]
    objective = objective_of(name, entry)
    backbone = zoo["backbones"][entry["backbone"]]
    hparams = {**copy.deepcopy(zoo["hparams"][objective]), **copy.deepcopy(entry["hparams"])}
    return {
        "run": name,
        "objective": objective,
        "family": run_family(name, entry, zoo["hparams"]),
        "backbone": entry["backbone"],
        "timm_model": backbone["timm_model"],
        "timm_kwargs": copy.deepcopy(backbone.get("timm_kwargs") or {}),
        "image_size": zoo["image_size"],
        "scenes": copy.deepcopy(zoo["scenes"]),
        "steps": entry["steps"],
        "stop_at": entry.get("stop_at"),
        "batch_size": entry["batch_size"],
        "lr": entry["lr"],
        "warmup_fraction": entry["warmup_fraction"],
        "weight_decay": entry["weight_decay"],
        "grad_clip": entry["grad_clip"],
        "jer_regulariser": dict(entry.get("jer_regulariser") or {}),
        "arrangement_groups": entry["arrangement_groups"],
        "seed": entry["seed"],
        "hparams": hparams,
        # only where set: a new key in every run's params would retrain every run once
        **({"save_at": sorted(entry["save_at"])} if entry.get("save_at") else {}),
    }
