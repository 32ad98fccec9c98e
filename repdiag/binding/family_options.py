"""The ``binding_families`` config section: the family comparison at the binding budget.

The paper compares encoders trained with different objectives. At the default's 300 steps of
batch 32 most self-supervised runs sit at chance, so a correlation across objectives there tests
nothing; config/ssl_steps.yaml showed SimCLR binding from about 3000 steps. ``series`` names
series (:mod:`repdiag.core.series`) with an ``objective`` axis and a ``seed`` axis whose runs
share one budget (backbone, steps, batch size): one run per objective and seed. Their models are
built by the on-request target ``binding_families`` only (rules/binding/families.smk), and analysed with
the config's controls (family ``control``, the same networks as the main study's) by the main
study's aggregation and statistics: the objective is the unit, its seeds nested
(:mod:`repdiag.binding.analysis.statistics`), into ``results/binding_families/``.

Read while Snakemake parses the workflow, so it imports neither torch nor the analysis modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.binding.causal.options import causal_models
from repdiag.common.families import APART_FAMILIES, CONTROL_FAMILY
from repdiag.core.errors import ConfigError
from repdiag.core.series import checkpoint_name, named_series, series_cells
from repdiag.encoders.zoo.spec import run_spec

AXES = ("objective", "seed")
"""The axes of a family series: the objective trained, and the seed (the replicate)."""

BUDGET_KEYS = ("backbone", "steps", "batch_size", "lr", "image_size")
"""What every run of a family series shares: the comparison is at one budget."""


def family_cells(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per run of the compared series: ``series``, ``objective`` (the axis label),
    ``seed``, ``run`` (the zoo run: the cell's own, or the existing run named for it),
    ``model`` (the model of that run, named like it) and ``declared`` (False for an existing
    run: it belongs to whichever part of the config declared it); then one per step the run
    saves (its ``save_at``: run and model ``<run>-step<t>``, ``saved_by`` the run)."""
    records = []
    for name, declared, existing in named_series(config, "binding_families.series", "its runs"):
        if set(declared.get("axes") or {}) != set(AXES):
            raise ConfigError(
                f"series.{name}.axes: a family series has exactly the axes {list(AXES)}; it has "
                f"{sorted(declared.get('axes') or {})}"
            )
        for cell in series_cells(name, declared):
            run = existing.get(cell["name"], cell["name"])
            record = {
                "series": name,
                "objective": cell["labels"]["objective"],
                "seed": int(cell["values"]["seed"]),
                "run": run,
                "model": run,
                "declared": cell["name"] not in existing,
            }
            records.append(record)
            saved = ((config.get("zoo") or {}).get("objectives") or {}).get(run) or {}
            for step in saved.get("save_at") or []:  # checkpoints nested in their run
                child = checkpoint_name(run, step)
                records.append(record | {"run": child, "model": child, "saved_by": run})
    return records


def family_models(config: Mapping[str, Any]) -> list[str]:
    """The models the compared series declare: built by ``binding_families``, not by
    ``binding`` (an existing run standing for a cell stays where it was declared)."""
    return sorted({cell["model"] for cell in family_cells(config) if cell["declared"]})


def family_members(config: Mapping[str, Any]) -> list[str]:
    """Every model the family comparison reads: the compared runs and the config's controls."""
    models = config.get("models") or {}
    controls = [key for key, entry in models.items() if entry.get("family") == CONTROL_FAMILY]
    compared = {cell["model"] for cell in family_cells(config)}
    return sorted(compared | set(controls)) if compared else []


def _check_cell(config: Mapping[str, Any], cell: Mapping[str, Any]) -> None:
    where = f"series.{cell['series']} ({cell['objective']}, seed {cell['seed']})"
    entry = (config.get("models") or {}).get(cell["model"])
    if entry is None or entry.get("source") != "zoo" or entry.get("id") != cell["run"]:
        raise ConfigError(
            f"{where}: no zoo model {cell['model']!r} of run {cell['run']!r} in models; a "
            "compared run is a zoo run with a model of the same name"
        )
    if entry.get("family") in APART_FAMILIES:
        raise ConfigError(
            f"models.{cell['model']}.family is {entry.get('family')!r}, which is kept out of "
            "every comparison across objectives; give the objective's family (axes.objective."
            "families)"
        )


def check_family_config(config: Mapping[str, Any]) -> None:
    """Every compared run is a zoo model of an objective family; within a series, every run
    shares one budget (``BUDGET_KEYS``); no model is both compared here and an arm of the JER
    intervention (registered in config_checks())."""
    cells = family_cells(config)
    both = sorted({cell["model"] for cell in cells} & set(causal_models(config)))
    if both:
        raise ConfigError(
            f"binding_families.series: {both} are also arms of the JER intervention "
            "(binding_causal.series); a compared run is trained without the regulariser"
        )
    budgets: dict[str, dict[str, tuple[str, Any]]] = {}
    for cell in cells:
        _check_cell(config, cell)
        spec = run_spec(config, cell["run"])
        budget = {key: spec.get(key) for key in BUDGET_KEYS}
        first = budgets.setdefault(cell["series"], {k: (cell["run"], v) for k, v in budget.items()})
        for key, value in budget.items():
            if value != first[key][1]:
                raise ConfigError(
                    f"series.{cell['series']}: runs {first[key][0]!r} and {cell['run']!r} have "
                    f"{key} {first[key][1]!r} and {value!r}; the objectives are compared at one "
                    "budget"
                )
