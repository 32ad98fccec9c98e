"""Series of training runs declared as grids (config key ``series``), expanded in one place.

A series is a base zoo run and named axes (seeds, doses, arms). Every cell of the product of
the axes is one zoo run (``zoo.objectives.<name>``) and one model (``models.<name>``, source
``zoo``) with the series' family. An axis either sets one dotted key of the run to each of its
values (``{set: hparams.slot_weight, values: [0.1, 0.3]}``) or merges a named patch into it
(``{patches: {plain: {}, sham: {jer_regulariser: {...}}}}``). The run's name is the series'
``name`` template filled with each axis' label: a patch's name, or the value written for a path
(``0.1`` -> ``0p1``, ``1.0`` -> ``1``, ``-0.05`` -> ``m0p05``). A cell that an existing run
already is (``existing: {dose_0_s0: supervised_s0}``) is not declared again: the series records
the existing run for it, so one network is trained and counted once. Models take the series'
``family``; an axis may give other families to some of its labels (``families: {"0":
supervised}``: a dose of 0 is the presence run, whose family is its objective's).

:func:`expand_series` is run by :func:`repdiag.core.config.fill_defaults` on the whole config,
so the workflow and every reader of a config see the expanded runs; it is idempotent.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from repdiag.core.errors import ConfigError

ZOO_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "zoo.schema.yaml"


def value_label(value: Any) -> str:
    """The label of an axis value in a run name: ``0.1`` -> ``0p1``, ``1.0`` -> ``1``,
    ``-0.05`` -> ``m0p05``, ``3`` -> ``3``, strings as they are."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:g}".replace("-", "m").replace(".", "p")


def _set_path(run: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = run
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted!r}: {key!r} of the base run is not a mapping")
    node[keys[-1]] = copy.deepcopy(value)


def _merge(run: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(run.get(key), dict):
            _merge(run[key], value)
        else:
            run[key] = copy.deepcopy(value)


def _axis_cells(where: str, axis: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(label, how to change the run) for each value of one axis."""
    if "patches" in axis:
        return [(str(label), ("patch", patch)) for label, patch in axis["patches"].items()]
    if "set" not in axis or "values" not in axis:
        raise ConfigError(f"{where}: an axis needs `set` and `values`, or `patches`")
    labels = [value_label(v) for v in axis["values"]]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{where}.values: two values give the same label ({labels})")
    return [(value_label(v), ("set", axis["set"], v)) for v in axis["values"]]


def series_cells(name: str, series: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every cell of series ``name``: its run name, its axis labels and values, and the zoo run
    it declares (before ``existing`` is applied), in the order of the axes' product."""
    where = f"series.{name}"
    axes = series.get("axes") or {}
    if not axes:
        raise ConfigError(f"{where}.axes: a series needs at least one axis")
    per_axis = {axis: _axis_cells(f"{where}.axes.{axis}", spec) for axis, spec in axes.items()}
    cells = []
    for combo in itertools.product(*per_axis.values()):
        labels = {axis: label for axis, (label, _) in zip(per_axis, combo, strict=True)}
        run = copy.deepcopy(dict(series.get("run") or {}))
        values: dict[str, Any] = {}
        for axis, (label, change) in zip(per_axis, combo, strict=True):
            if change[0] == "patch":
                _merge(run, change[1] or {})
                values[axis] = label
            else:
                _set_path(run, change[1], change[2])
                values[axis] = change[2]
        try:
            run_name = str(series["name"]).format(**labels)
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(
                f"{where}.name: {series.get('name')!r} cannot be filled from the axes "
                f"{list(axes)} ({err}); write each axis as {{axis}}"
            ) from None
        family = series.get("family")
        for axis, label in labels.items():
            family = (axes[axis].get("families") or {}).get(label, family)
        cells.append(
            {"name": run_name, "labels": labels, "values": values, "run": run, "family": family}
        )
    names = [cell["name"] for cell in cells]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(
            f"{where}.name: {series['name']!r} gives the same run name to several cells "
            f"({repeated}); name every axis in it"
        )
    return cells


def named_series(
    config: Mapping[str, Any], key: str, what: str
) -> list[tuple[str, Mapping[str, Any], dict[str, str]]]:
    """The series a config section lists by name (``key``, e.g. ``binding_causal.series``):
    per name, the series and its ``existing`` map. A name that is not a series is a ConfigError
    naming ``key``; ``what`` says what the user declares under it (e.g. "its arms")."""
    section, _, field = key.rpartition(".")
    names = list((config.get(section) or {}).get(field) or [])
    all_series = config.get("series") or {}
    found = []
    for name in names:
        if name not in all_series:
            raise ConfigError(
                f"{key}: {name!r} is not a series (has {sorted(all_series)}); declare {what} "
                "under series"
            )
        declared = all_series[name]
        found.append((name, declared, dict(declared.get("existing") or {})))
    return found


@cache
def _run_schema() -> dict[str, Any]:
    schema = yaml.safe_load(ZOO_SCHEMA.read_text())
    return schema["properties"]["objectives"]["additionalProperties"]


def _with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` with every missing ``default`` of ``schema`` set (properties, nested), as
    :func:`repdiag.core.config.fill_defaults` does; the zoo run schema has no ``$ref``."""
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _with_defaults(value[key], sub)
    return value


@cache
def _families() -> tuple[str, ...]:
    schema = yaml.safe_load((ZOO_SCHEMA.parent / "models.schema.yaml").read_text())
    return tuple(schema["additionalProperties"]["properties"]["family"]["enum"])


def _check_run(where: str, run: Mapping[str, Any], family: Any) -> None:
    import jsonschema

    if family not in _families():
        raise ConfigError(f"{where}: family {family!r} is not one of {', '.join(_families())}")

    from repdiag.core.validation import strict_integers

    validator = strict_integers(jsonschema.Draft202012Validator)
    errors = sorted(validator(_run_schema()).iter_errors(run), key=str)
    if errors:
        first = errors[0]
        path = ".".join(str(p) for p in first.absolute_path) or "(the run)"
        raise ConfigError(f"{where}: {path}: {first.message} (schemas/zoo.schema.yaml)")


def _declare(config: dict[str, Any], where: str, name: str, run: dict, family: str) -> None:
    """Add zoo run and model ``name``; an identical existing entry is kept (idempotence), a
    different one is an error."""
    runs = config.setdefault("zoo", {}).setdefault("objectives", {})
    models = config.setdefault("models", {})
    model = {"source": "zoo", "id": name, "family": family}
    run = _with_defaults(copy.deepcopy(run), _run_schema())
    if name in runs and _with_defaults(copy.deepcopy(runs[name]), _run_schema()) != run:
        raise ConfigError(
            f"{where}: zoo.objectives.{name} is declared by hand and by the series with other "
            "settings; remove one of them"
        )
    if name in models and {key: models[name].get(key) for key in model} != model:
        raise ConfigError(
            f"{where}: models.{name} is declared by hand and by the series as {model}; remove "
            "one of them"
        )
    runs[name] = run
    models.setdefault(name, model)


def expand_series(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Declare every cell of every ``series`` entry as a zoo run and a model, in place.

    Returns, per series, cell name -> the run that stands for it (the cell itself, or the run
    named for it in ``existing``). Each declared run is checked against the zoo run schema.
    """
    members: dict[str, dict[str, str]] = {}
    for name, series in (config.get("series") or {}).items():
        where = f"series.{name}"
        existing = dict(series.get("existing") or {})
        cells = series_cells(name, series)
        names = {cell["name"] for cell in cells}
        saves = dict(series.get("save_at") or {})
        for key, listed in (("existing", existing), ("save_at", saves)):
            unknown = sorted(set(listed) - names)
            if unknown:
                raise ConfigError(f"{where}.{key}: {unknown} are not cells of the series")
        members[name] = {}
        for cell in cells:
            stand_in = existing.get(cell["name"])
            if stand_in is not None:
                runs = (config.get("zoo") or {}).get("objectives") or {}
                if stand_in not in runs:
                    raise ConfigError(
                        f"{where}.existing.{cell['name']}: {stand_in!r} is not a zoo run "
                        "(zoo.objectives)"
                    )
                members[name][cell["name"]] = stand_in
                continue
            if cell["name"] in saves:
                cell["run"]["save_at"] = list(saves[cell["name"]])
            _check_run(f"{where} cell {cell['name']}", cell["run"], cell["family"])
            _declare(config, where, cell["name"], cell["run"], cell["family"])
            members[name][cell["name"]] = cell["name"]
    return members


CHECKPOINT_NAME = "{run}-step{step}"
RUN_NAME_MAX = 64  # schemas/zoo.schema.yaml: zoo.objectives' propertyNames


def checkpoint_name(run: str, step: int) -> str:
    """The zoo run that step ``step`` of run ``run``'s ``save_at`` becomes."""
    return CHECKPOINT_NAME.format(run=run, step=int(step))


def _check_saving(where: str, name: str, entry: Mapping[str, Any]) -> None:
    steps = entry.get("steps")
    late = [step for step in entry["save_at"] if steps is not None and step >= steps]
    if late:
        raise ConfigError(
            f"{where}: steps {late} are not before the run's last step ({steps}); the final "
            "network is the run itself"
        )
    if entry.get("stop_at") is not None:
        raise ConfigError(f"{where}: a run that stops early (stop_at) saves nothing; remove one")
    if float((entry.get("jer_regulariser") or {}).get("weight") or 0.0):
        raise ConfigError(
            f"{where}: a pushed run (jer_regulariser) cannot save steps (its push is not saved "
            "per step); declare stop_at runs for its checkpoints instead"
        )
    longest = checkpoint_name(name, max(entry["save_at"]))
    if len(longest) > RUN_NAME_MAX:
        raise ConfigError(
            f"{where}: the checkpoint run {longest!r} is longer than {RUN_NAME_MAX} characters; "
            "shorten the run's name"
        )


def _declare_saved_model(config: dict[str, Any], parent: str, child: str) -> bool:
    """A model for the saved step ``child`` of a run whose model a series declared (key and id
    the run's name), in the run's family, unless some model already reads ``child`` (a hand-
    declared checkpoint model keeps its own key). Whether it declared one."""
    models = config.setdefault("models", {})
    entry = models.get(parent) or {}
    readers = [m for m in models.values() if (m or {}).get("id") == child]
    if entry.get("source") != "zoo" or entry.get("id") != parent or readers:
        return False
    models[child] = {"source": "zoo", "id": child, "family": entry.get("family")}
    return True


def expand_saved(config: dict[str, Any]) -> bool:
    """Declare the zoo run ``<name>-step<t>`` (:func:`checkpoint_name`) for every step ``t`` a
    run's ``save_at`` lists, in place: the run's settings with ``stop_at: t`` and ``saved_by``
    the run, whose one training writes it (repdiag.encoders.zoo.saved), and its model where a
    series declared the run's (:func:`_declare_saved_model`; returns whether it declared any).
    A ``saved_by`` no ``save_at`` explains, or a run of that name with other settings, is a
    ConfigError."""
    runs = (config.get("zoo") or {}).get("objectives") or {}
    declared_models = False
    for name, entry in list(runs.items()):
        if not isinstance(entry, dict) or not entry.get("save_at"):
            continue
        where = f"zoo.objectives.{name}.save_at"
        _check_saving(where, name, entry)
        for step in entry["save_at"]:
            child = checkpoint_name(name, step)
            declared = {**copy.deepcopy(entry), "save_at": [], "stop_at": step, "saved_by": name}
            declared["objective"] = entry.get("objective") or name  # not the child's name
            if child in runs and runs[child] != declared:
                raise ConfigError(
                    f"{where}: step {step} is the run {child!r}, which zoo.objectives already "
                    "declares with other settings; rename one of them"
                )
            runs[child] = declared
            declared_models = _declare_saved_model(config, name, child) or declared_models
    for name, entry in runs.items():
        parent = entry.get("saved_by") if isinstance(entry, dict) else None
        if parent is None:
            continue
        saved = (runs.get(parent) or {}).get("save_at") or []
        if not any(name == checkpoint_name(parent, step) for step in saved):
            raise ConfigError(
                f"zoo.objectives.{name}.saved_by: set by the workflow for the steps a run's "
                "save_at lists; remove it (or list the step in the run's save_at)"
            )
    return declared_models
