"""The causal test from its runs' files to its tables and summary (rule ``causal_effects``).

One call for the workflow's adapter and for a notebook: the per-model table
(:func:`repdiag.binding.analysis.aggregate.aggregate`), each run's record and full-spectrum JER
(:mod:`repdiag.binding.causal`), the arms with the loss screen, the per-seed contrasts and the
markdown summary (:mod:`repdiag.binding.causal_report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.causal import (
    arm_table,
    causal_contrasts,
    full_spectrum_jer,
    run_record,
    screen_losses,
)
from repdiag.binding.causal_report import causal_markdown
from repdiag.binding.stats_options import StatsSettings
from repdiag.common.tables import read_table


@dataclass(frozen=True)
class CausalFiles:
    """Per model (in the table's order): its metrics JSON, Jacobian store and zoo ``meta.json``;
    and the calibration pilot's table."""

    metrics: Mapping[str, str]
    jacobians: Mapping[str, str]
    zoo_meta: Mapping[str, str]
    calibration: str


@dataclass(frozen=True)
class CausalEffects:
    arms: pd.DataFrame
    """One row per base, arm and seed (binding, JER, full-spectrum pr and pr2, loss, screen)."""
    contrasts: pd.DataFrame
    """Per base, role, metric, arm and reference: the per-seed contrast with its t-interval."""
    models: pd.DataFrame
    """The per-model table the arms were read from."""
    summary: str
    """The markdown summary (results/binding_causal/summary.md)."""


def causal_effects(
    models: Mapping[str, Mapping[str, Any]],
    files: CausalFiles,
    cells: Mapping[str, Any],
    settings: StatsSettings,
    loss_spread_sd: float,
) -> CausalEffects:
    """The causal test's tables. ``models``: each run's config entry (family, source), in the
    table's order; ``cells`` maps each run to its base, arm and seed
    (``repdiag.binding.causal_options``); runs whose final objective loss lies more than
    ``loss_spread_sd`` SDs from the plain runs' mean are left out of every contrast."""
    table = aggregate(models, files.metrics, files.jacobians, settings, files.zoo_meta).models
    final = table.set_index("model")["final_layer"].astype(str)
    extras = {
        key: run_record(files.zoo_meta[key])
        | full_spectrum_jer(files.jacobians[key], final[key], settings.probe_set)
        for key in models
    }
    arms = screen_losses(arm_table(cells, table, extras, settings.binding_column), loss_spread_sd)
    contrasts = causal_contrasts(arms, settings.confidence)
    summary = causal_markdown(
        arms,
        contrasts,
        read_table(files.calibration),
        spread_sd=loss_spread_sd,
        readout=settings.readout,
    )
    return CausalEffects(arms=arms, contrasts=contrasts, models=table, summary=summary)
