"""The units of the binding study's comparison across models (the training run is the
unit of replication, the seeds of an objective are nested in it, checkpoints in their run).

Every row of the models table is one network. Two keys say what it replicates:

- its **training run** (:func:`run_labels`): the run's configuration and seed. A checkpoint
  (``stop_at``) is its run's, so it shares the key of the run's final network; a network of 0
  steps is the untrained network of its backbone and seed, whichever run it was listed for
  (``random_resnet`` and a step-0 checkpoint are one network);
- its **unit** (:func:`unit_labels`): for a run of an objective family, the objective's
  configuration (every training setting except the seed and ``stop_at``; ``configuration`` in
  the models table), named by its objective and, where one objective was trained in several
  configurations, the settings that tell them apart (:func:`_naming_keys`); any other network
  (a pretrained encoder, a hand-built control, an upper bound trained once) is its own unit.

The family comparison's unit is the objective with its seeds nested: :func:`unit_means`
averages each unit's training runs (one row per unit, ``n_runs`` beside it) after refusing two
rows of one run (:func:`repdiag.common.units.require_independent`), and every analysis
across units refuses rows that are not independent units, naming them (:func:`require_units`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from repdiag.binding import APART_FAMILIES, BINDING_SUPERVISED_FAMILY, CONTROL_FAMILY
from repdiag.common.units import Units, check_units

UNIT = "objective (mean over its seeds)"
"""What a unit of the family comparison is, as the tables state it (``unit`` column)."""
UNIT_WITH_CONTROLS = f"{UNIT}; each control or upper bound its own unit"
COMPARED_APART = (CONTROL_FAMILY, BINDING_SUPERVISED_FAMILY)
"""Families shown beside the objectives (their own units); the dose series and the JER
intervention have analyses of their own (repdiag.binding.dose, repdiag.binding.causal)."""
TRAINED = "trained"
LEARNED = "trained, learned"
WITH_CONTROLS = "trained + controls"
CONFIGURATION_KEYS = (
    "objective",
    "backbone",
    "timm_model",
    "timm_kwargs",
    "steps",
    "batch_size",
    "lr",
    "warmup_fraction",
    "weight_decay",
    "grad_clip",
    "hparams",
    "arrangement_groups",
    "jer_regulariser",
)
"""The settings of a zoo run that make its configuration: everything but the seed, the run's
name and where it stopped (``stop_at``)."""
RECORDED_NOT_SET = ("estimate_first", "estimate_last_mean", "steps_up", "steps_down")
"""Keys of ``meta.json["jer_regulariser"]`` measured during training, not set before it."""


def configuration(meta: Mapping[str, Any]) -> str:
    """The configuration of a zoo run from its ``meta.json``: :data:`CONFIGURATION_KEYS` as
    canonical JSON (sorted keys), the regulariser's recorded estimates left out."""
    settings = {key: meta.get(key) for key in CONFIGURATION_KEYS}
    if isinstance(settings["jer_regulariser"], Mapping):
        settings["jer_regulariser"] = {
            k: v for k, v in settings["jer_regulariser"].items() if k not in RECORDED_NOT_SET
        }
    return json.dumps(settings, sort_keys=True, default=str)


def _settings(row: pd.Series) -> dict[str, Any] | None:
    text = row.get("configuration")
    return json.loads(text) if isinstance(text, str) and text.startswith("{") else None


def saved_steps(table: pd.DataFrame) -> pd.Series:
    """Rows of a network saved before its run's last step: ``step`` below the ``steps`` of its
    configuration (False where either is unknown: a pretrained encoder, a control)."""
    configured = [(_settings(row) or {}).get("steps") for _, row in table.iterrows()]
    step = pd.to_numeric(table.get("step", pd.Series(np.nan, index=table.index)), errors="coerce")
    total = pd.to_numeric(pd.Series(configured, index=table.index, dtype=object), errors="coerce")
    return (step < total).fillna(False)


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"hparams.label": "slot_shape", ...}``: nested settings as dotted keys."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return out


UNSET = "unset"
"""How a unit's name shows a setting its configuration does not have (not the JSON ``null``)."""


def _naming_keys(same: list[dict[str, str]]) -> list[str]:
    """Settings that tell ``same`` (one objective's flattened configurations) apart, shallowest
    first, none of which could be dropped: a key joins only if it separates configurations the
    keys before it did not, and is dropped again if the others separate them without it
    (``backbone`` alone names a ResNet and a ViT, not their every timm keyword). A setting one
    configuration lacks counts as :data:`UNSET`, so "null" and "absent" stay two names."""

    def distinct(keys: list[str]) -> int:
        return len({tuple(f.get(k, UNSET) for k in keys) for f in same})

    differing = sorted(
        {k for f in same for k in f if len({g.get(k, UNSET) for g in same}) > 1},
        key=lambda k: (k.count("."), k),
    )
    target = distinct(differing)
    chosen: list[str] = []
    for key in differing:
        if distinct(chosen) == target:
            break
        if distinct([*chosen, key]) > distinct(chosen):
            chosen.append(key)
    for key in reversed(list(chosen)):
        rest = [k for k in chosen if k != key]
        if distinct(rest) == target:
            chosen = rest
    return sorted(chosen)


def _named(configs: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """A short name per configuration: its objective, plus ``[key=value, ...]`` for the settings
    that tell apart the configurations of the same objective (:func:`_naming_keys`)."""
    flat = {c: _flat(s) for c, s in configs.items()}
    names = {}
    for config, settings in configs.items():
        same = [flat[o] for o, s in configs.items() if s.get("objective") == settings["objective"]]
        keys = _naming_keys(same)
        differ = ", ".join(f"{k}={flat[config].get(k, UNSET)}" for k in keys)
        names[config] = f"{settings['objective']}" + (f" [{differ}]" if differ else "")
    return names


def unit_labels(table: pd.DataFrame) -> list[str]:
    """The unit of each row (module docstring): the configuration's name for a run of an
    objective family; the model's own name for any other network, unless its configuration
    has several runs (seeds), which are then one unit named by it and its family."""
    settings = [_settings(row) for _, row in table.iterrows()]
    apart = table["family"].isin(APART_FAMILIES).to_numpy()
    config = table.get("configuration", pd.Series(np.nan, index=table.index)).tolist()
    runs = pd.Series([c if s else None for c, s in zip(config, settings, strict=True)])
    counts = runs.value_counts()
    names = {}
    for scope in (False, True):
        configs = {
            c: s for c, s, a in zip(config, settings, apart, strict=True) if s and a == scope
        }
        names[scope] = _named(configs)
    labels = []
    for model, family, c, s, a in zip(
        table["model"], table["family"], config, settings, apart, strict=True
    ):
        if s is None or (a and counts.get(c, 0) < 2):
            labels.append(str(model))
        else:
            labels.append(names[a][c] + (f" ({family})" if a else ""))
    return labels


def run_labels(table: pd.DataFrame) -> list[str]:
    """The training run of each row (module docstring): ``<configuration name> seed <s>``, the
    untrained network of a backbone and seed for a network of 0 steps, the model otherwise."""
    units = table["unit"].tolist() if "unit" in table else unit_labels(table)
    labels = []
    for (_, row), unit in zip(table.iterrows(), units, strict=True):
        settings, seed = _settings(row), pd.to_numeric(row.get("seed"), errors="coerce")
        seed_text = f"seed {float(seed):.0f}" if np.isfinite(float(seed)) else "seed n/a"
        if settings is None:
            labels.append(str(row["model"]))
        elif float(row.get("step", math.nan)) == 0.0:
            labels.append(f"untrained {settings.get('timm_model')}, {seed_text}")
        else:
            labels.append(f"{unit}, {seed_text}")
    return labels


def with_units(table: pd.DataFrame) -> pd.DataFrame:
    """The models table with ``unit`` and ``training_run`` columns (computed once, over every
    model, so that a unit has one name in every table)."""
    out = table.copy()
    if "unit" not in out:
        out["unit"] = unit_labels(out)
    out["training_run"] = run_labels(out)
    return out


def require_runs(table: pd.DataFrame, what: str) -> None:
    """Refuse ``what`` when two rows of ``table`` are one training run (a checkpoint and its
    run's final network, an untrained network listed twice), naming them. The runs are
    averaged within their unit, not blocked by seed (a pretrained encoder has no seed): one
    block."""
    runs = table["training_run"] if "training_run" in table else run_labels(table)
    models = tuple(table["model"].astype(str))
    units = Units(tuple(map(str, runs)), ("all",) * len(table), "training run", models)
    check_units(units, what)


def comparison_units(table: pd.DataFrame) -> Units:
    """The units of the family comparison's rows (one block, no seeds: a row is an objective's
    mean over its seeds), named by the model column, for every analysis across units."""
    units = table["unit"] if "unit" in table else unit_labels(table)
    models = tuple(table["model"].astype(str))
    return Units(tuple(map(str, units)), ("all",) * len(table), "objective", models)


def require_units(table: pd.DataFrame, what: str) -> None:
    """Refuse ``what`` when two rows of ``table`` are one unit of the family comparison (two
    seeds of one objective counted as two observations), naming them."""
    check_units(comparison_units(table), what)


def unit_means(table: pd.DataFrame, what: str) -> pd.DataFrame:
    """One row per unit: every numeric column averaged over the unit's training runs (``n_runs``
    of them, ``n_seeds`` distinct seeds, listed in ``models``); ``model`` and ``unit`` are the
    unit's name. Refuses ``what`` when two rows are one training run (:func:`require_runs`)."""
    table = table if "training_run" in table else with_units(table)
    require_runs(table, what)
    if table.empty:
        return table.assign(n_runs=[], n_seeds=[], models=[])
    numeric = table.select_dtypes("number").drop(columns=["seed"], errors="ignore")
    groups = numeric.assign(unit=table["unit"]).groupby("unit", sort=False)
    means = groups.mean()
    by_unit = table.groupby("unit", sort=False)
    means["n_runs"] = by_unit.size()
    means["n_seeds"] = by_unit["seed"].nunique() if "seed" in table else 1
    means["models"] = by_unit["model"].agg(lambda names: ";".join(map(str, names)))
    means["family"] = by_unit["family"].first()
    out = means.rename_axis("unit").reset_index()
    return out.assign(model=out["unit"])


def runs_behind(means: pd.DataFrame, columns: list[str]) -> int:
    """How many training runs stand behind the units with a finite value in every column."""
    complete = np.isfinite(means[columns].astype(float)).all(axis=1)
    return int(means.loc[complete, "n_runs"].sum()) if "n_runs" in means else int(complete.sum())
