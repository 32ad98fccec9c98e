"""What the binding study's workflow targets build: ``binding`` (the main study),
``binding_causal`` (the JER intervention) and ``binding_families`` (the objectives at the binding
budget), as paths, from the config alone (gathered by :func:`repdiag.studies.final_outputs`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from repdiag.binding.causal.options import causal_cells, causal_models
from repdiag.binding.family_options import family_members, family_models
from repdiag.binding.replicate_options import REPLICATE_DIR, replicate_models
from repdiag.common.figures import figure_paths
from repdiag.encoders.zoo.spec import zoo_runs_of

TABLES = (
    "models.csv",
    "depth_profiles.csv",
    "spectra.csv",
    "correlations.csv",
    "ols.csv",
    "ols_summary.txt",
    "partial.csv",
    "families.csv",
    "robustness.csv",
    "dose_series.csv",
    "between_within.csv",
    "paper_comparison.csv",
)
"""The statistics tables (rules aggregate_models and stats_tables), in results/tables for the
main study and in results/binding_families for the family comparison."""

FIGURES = ("metric_scatter", "dose_series", "jacobian_spectra", "depth_profiles", "readouts")
"""The main study's figures, each as .png and .pdf in results/figures."""

FAMILIES_DIR = "results/binding_families"


def binding_models(config: Mapping[str, Any]) -> dict[str, Any]:
    """The main study's models: every model of the config except those built on request only:
    the JER intervention's arms, the family comparison's runs and the dose series' replicate."""
    requested_only = (
        set(causal_models(config)) | set(family_models(config)) | set(replicate_models(config))
    )
    models = config.get("models") or {}
    return {key: entry for key, entry in models.items() if key not in requested_only}


AGGREGATE_STATS_KEYS = (
    "readout",
    "binding_score",
    "jer_formula",
    "jer_at",
    "probe_set",
    "confidence",
)
"""The ``stats`` keys the models table reads (another key changes no row)."""


def aggregate_models(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The aggregate rules' ``models`` param: each model's family, source and covariates."""
    models = config["models"]
    return {
        key: {
            "family": models[key]["family"],
            "source": models[key]["source"],
            "covariates": models[key].get("covariates", {}),
        }
        for key in keys
    }


def aggregate_stats(config: Mapping[str, Any], binding_score: str | None = None) -> dict[str, Any]:
    """The aggregate rules' ``stats`` param: :data:`AGGREGATE_STATS_KEYS` of the config, the
    binding score (the models table's ``binding`` column) replaced by a target's own where it
    has one (``binding_families.binding_score``), so that its tables and models.csv agree."""
    stats = {key: config["stats"][key] for key in AGGREGATE_STATS_KEYS}
    if binding_score is not None:
        stats["binding_score"] = binding_score
    return stats


def family_stats(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``stats`` section as the family comparison reads it: the main study's, its headline
    score replaced by ``binding_families.binding_score`` (the tables, the summary's labels and
    the scatter's axis all name the score its models table holds)."""
    return {**config["stats"], "binding_score": config["binding_families"]["binding_score"]}


def _per_model(models: Mapping[str, Any]) -> list[str]:
    return [
        *(f"results/embeddings/{key}.zarr" for key in models),
        *(f"results/jacobians/{key}.{ext}" for key in models for ext in ("zarr", "json")),
        *(f"results/metrics/{key}.json" for key in models),
    ]


def main_outputs(config: Mapping[str, Any]) -> list[str]:
    """`snakemake binding`: the benchmark, every main-study model's embeddings, spectra and
    metrics, the zoo's runs and learning curves, the tables, figures and results/summary.md."""
    models = binding_models(config)
    runs = zoo_runs_of(models)
    zoo = (
        [*(f"results/zoo/{run}/meta.json" for run in runs), *figure_paths("zoo_curves")]
        if runs
        else []
    )
    return [
        "results/datasets/binding.zarr",
        "results/datasets/binding_contact_sheet.png",
        *_per_model(models),
        *zoo,
        *(f"results/tables/{name}" for name in TABLES),
        *(path for stem in FIGURES for path in figure_paths(stem)),
        "results/summary.md",
    ]


def causal_outputs(config: Mapping[str, Any]) -> list[str]:
    """`snakemake binding_causal`: the arms, contrasts and models tables, the digest and figure
    (nothing when no series is named in binding_causal.series)."""
    if not causal_cells(config):
        return []
    tables = (
        "arms.csv",
        "contrasts.csv",
        "displacement.csv",
        "binding_per_jer.csv",
        "plain_associations.csv",
        "models.csv",
        "summary.md",
    )
    return [*(f"results/binding_causal/{name}" for name in tables), *figure_paths("binding_causal")]


def family_outputs(config: Mapping[str, Any]) -> list[str]:
    """`snakemake binding_families`: the main study's tables, scatter and digest over the compared
    families, the pre-registered primary family (``primary.csv``) and the within-run split
    (``within_run.csv``), in results/binding_families (nothing when no series is named)."""
    if not family_members(config):
        return []
    return [
        *(f"{FAMILIES_DIR}/{name}" for name in (*TABLES, "primary.csv", "within_run.csv")),
        *figure_paths("metric_scatter", FAMILIES_DIR),
        f"{FAMILIES_DIR}/summary.md",
    ]


def replicate_outputs(config: Mapping[str, Any]) -> list[str]:
    """`snakemake binding_replicate`: the replicate's per-model tables, its dose series (the main
    study's analysis) and their comparison with the main run's (nothing when no series is named
    in binding_replicate.series)."""
    if not replicate_models(config):
        return []
    tables = ("models.csv", "depth_profiles.csv", "spectra.csv", "dose_series.csv")
    return [f"{REPLICATE_DIR}/{name}" for name in (*tables, "comparison.csv", "comparison.md")]


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """The final outputs of each of the binding study's targets."""
    return {
        "binding": main_outputs(config),
        "binding_causal": causal_outputs(config),
        "binding_families": family_outputs(config),
        "binding_replicate": replicate_outputs(config),
    }
