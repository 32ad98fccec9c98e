"""What each control encoder (:mod:`repdiag.binding.controls`) assumes about the images it
scores, and the config check that ``datasets.binding`` is what they assume. Torch-free: the
check is cheap to import where a run starts (``repdiag.binding.build_checks()``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from repdiag.common.render import BENCHMARK_SHAPES
from repdiag.core.errors import ConfigError

CONTROLS_MODULE = "repdiag.binding.controls"

DEFAULT_IMAGE_SIZE = 64
DEFAULT_GRID = (2, 2)
DEFAULT_ROTATION_DEG = 15.0

DEFAULTS: dict[str, Any] = {
    "image_size": DEFAULT_IMAGE_SIZE,
    "grid": DEFAULT_GRID,
    "shapes": BENCHMARK_SHAPES,
    "rotation_deg": DEFAULT_ROTATION_DEG,
}
"""The controls' defaults for what they assume: the embedded default's dataset."""

DATASET_KEYS = {
    "image_size": "image_size",
    "grid": "grid",
    "shapes": "shapes",
    "rotation_deg": "jitter.rotation_deg",
}
"""A control's keyword argument -> the ``datasets.binding`` key it must equal."""

ASSUMES: dict[str, tuple[str, ...]] = {
    "layout_mask": ("image_size",),
    "slot_area": ("image_size", "grid"),
    "occupancy": ("image_size", "grid"),
    "colour_histogram": ("image_size",),
    "shape_oracle": ("image_size", "grid", "shapes", "rotation_deg"),
    "bag_of_shapes": ("image_size", "grid", "shapes", "rotation_deg"),
    "random_features": ("image_size",),
}
"""Each registered control's keyword arguments among :data:`DATASET_KEYS` (a test holds this
equal to the classes' signatures and their defaults to :data:`DEFAULTS`)."""


def _dataset_value(binding: Mapping[str, Any], dotted: str) -> Any:
    value: Any = binding
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _canonical(value: Any, argument: str) -> Any:
    """``value`` in the form it is compared in; raises ValueError or TypeError if it has none."""
    if argument == "shapes":
        if isinstance(value, str):
            raise TypeError("a list of shape names")
        return sorted(str(v) for v in value)
    if argument == "grid":
        if isinstance(value, str):
            raise TypeError("a list of two integers")
        return [int(g) for g in value]
    if isinstance(value, (str, bool)) or value is None:
        raise TypeError("a number")
    return float(value)


def _check_entry(key: str, entry: Mapping[str, Any], binding: Mapping[str, Any]) -> None:
    name = str(entry["id"]).split(":", 1)[1]
    given = dict(entry.get("kwargs") or {})
    for argument in ASSUMES.get(name, ()):
        dataset_key = DATASET_KEYS[argument]
        wanted = _dataset_value(binding, dataset_key)
        value = given.get(argument, DEFAULTS[argument])
        try:
            same = _canonical(value, argument) == _canonical(wanted, argument)
        except (TypeError, ValueError) as err:
            if wanted is None:
                continue  # the dataset does not say: nothing to compare with
            raise ConfigError(
                f"models.{key}.kwargs.{argument}: {value!r} is not {err}"
                if argument in given
                else f"datasets.binding.{dataset_key}: {wanted!r} is not {err}"
            ) from err
        if not same:
            raise ConfigError(
                f"models.{key}: the control's {argument} is {value!r} but "
                f"datasets.binding.{dataset_key} is {wanted!r}; give it "
                f"kwargs: {{{argument}: {wanted!r}}} (a control must assume the images it scores; "
                "its defaults are the embedded default's dataset)"
            )


def check_controls_config(config: Mapping[str, Any], models: Collection[str] | None = None) -> None:
    """Each control among ``models`` (default: every model; ``source: python``, an ``id`` of
    :data:`CONTROLS_MODULE`) assumes the images of ``datasets.binding``: its image size, grid,
    shapes and rotation range (its ``kwargs``, else :data:`DEFAULTS`) must equal the dataset's,
    or the oracle would score below its ceiling for a reason that is not the metric's.

    A pre-run check (``repdiag.binding.build_checks()``: `repdiag validate` and a run's
    ``onstart``), not a check of every parse: a cluster job's Snakemake reads the workflow's
    ``config/config.yaml`` extended by the run's config file, so its models (the default's
    controls) and its dataset (the run's) need not belong together there."""
    binding = (config.get("datasets") or {}).get("binding")
    if not isinstance(binding, Mapping):
        return
    for key, entry in (config.get("models") or {}).items():
        if (models is not None and key not in models) or not isinstance(entry, Mapping):
            continue  # a malformed entry is the schema's to name
        target = str(entry.get("id", ""))
        if entry.get("source") == "python" and target.startswith(f"{CONTROLS_MODULE}:"):
            _check_entry(key, entry, binding)
