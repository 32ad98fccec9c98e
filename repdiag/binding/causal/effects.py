"""The causal test from its runs' files to its tables and summary (rule ``causal_effects``).

One call for the workflow's adapter and for a notebook: the per-model table
(:func:`repdiag.binding.analysis.aggregate.aggregate`), each run's record, full-spectrum JER and
weight displacement (:mod:`repdiag.binding.causal.analysis`), the arms, the per-seed contrasts with their
families, the displacement summary, binding per unit of JER, the plain runs' associations and
the markdown summary (:mod:`repdiag.binding.causal.report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.analysis.options import StatsSettings
from repdiag.binding.causal.analysis import (
    arm_table,
    binding_per_jer,
    causal_contrasts,
    displacement_summary,
    full_spectrum_jer,
    plain_associations,
    run_record,
    weight_displacements,
)
from repdiag.binding.causal.report import causal_markdown
from repdiag.common.tables import read_table


@dataclass(frozen=True)
class CausalFiles:
    """Per model (in the table's order): its metrics JSON, Jacobian store, zoo ``meta.json`` and
    ``model.safetensors``; per pushed model its ``push.safetensors``; the calibration pilot's
    table."""

    metrics: Mapping[str, str]
    jacobians: Mapping[str, str]
    zoo_meta: Mapping[str, str]
    weights: Mapping[str, str]
    pushes: Mapping[str, str]
    calibration: str


@dataclass(frozen=True)
class CausalEffects:
    arms: pd.DataFrame
    """One row per base, arm and seed: binding, Same/Different, JER, geometry, presence loss,
    displacement."""
    contrasts: pd.DataFrame
    """Per base, family, metric, arm and reference: the per-seed contrast, t and exact p, Holm."""
    displacement: pd.DataFrame
    """Per base and pushed arm: distance and displacement along the push, against raise and null."""
    per_jer: pd.DataFrame
    """The raise arm's binding change per unit of JER change."""
    associations: pd.DataFrame
    """Across the plain runs: binding with JER and with G.PR."""
    models: pd.DataFrame
    """The per-model table the arms were read from."""
    summary: str
    """The markdown summary (results/binding_causal/summary.md)."""


def causal_effects(
    models: Mapping[str, Mapping[str, Any]],
    files: CausalFiles,
    cells: Any,
    settings: StatsSettings,
) -> CausalEffects:
    """The causal test's tables. ``models``: each run's config entry (family, source), in the
    table's order; ``cells`` maps each run to its base, arm and seed
    (``repdiag.binding.causal.options``). Every run is kept (intention to treat)."""
    table = aggregate(models, files.metrics, files.jacobians, settings, files.zoo_meta).models
    final = table.set_index("model")["final_layer"].astype(str)
    moved = weight_displacements(cells, files.weights, files.pushes)
    extras = {
        key: run_record(files.zoo_meta[key])
        | full_spectrum_jer(files.jacobians[key], final[key], settings.probe_set)
        | moved[key]
        for key in models
    }
    arms = arm_table(cells, table, extras, settings.binding_column)
    contrasts = causal_contrasts(arms, settings.confidence)
    moved_summary = displacement_summary(arms, settings.confidence)
    per_jer = binding_per_jer(arms, seed=settings.draw_seed, confidence=settings.confidence)
    associations = plain_associations(
        arms, settings.confidence, settings.n_bootstrap, settings.draw_seed
    )
    summary = causal_markdown(
        arms,
        contrasts,
        read_table(files.calibration),
        moved_summary,
        per_jer,
        associations,
        readout=settings.readout,
    )
    return CausalEffects(
        arms=arms,
        contrasts=contrasts,
        displacement=moved_summary,
        per_jer=per_jer,
        associations=associations,
        models=table,
        summary=summary,
    )
