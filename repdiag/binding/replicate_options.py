"""The ``binding_replicate`` config section: a second realisation of the dose series.

Training here is chaotic: the same commit on two machines gives binding values up to 0.03 apart,
and any perturbation, however small, sends a run elsewhere (the causal test's null arm). A
verdict that holds in one realisation of the dose series and not in another varies between
runs. ``series`` names a series (:mod:`repdiag.core.series`) that repeats the dose series' grid
(a ``lambda`` axis setting ``hparams.slot_weight`` and a ``seed`` axis) with every run carrying
the null arm's negligible push (``jer_regulariser`` with 0 < |weight| <= 1e-6): the same design,
another draw of the chaos. Its runs are built by ``snakemake binding_replicate`` only and
analysed by the main study's aggregation and statistics into ``results/binding_replicate/``,
then set beside the main run's ``results/tables/dose_series.csv``
(:mod:`repdiag.binding.replicate`).

Read while Snakemake parses the workflow, so it imports neither torch nor the analysis modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.core.errors import ConfigError
from repdiag.core.series import named_series, series_cells
from repdiag.encoders.zoo.spec import NULL_MAX_WEIGHT, run_spec

REPLICATE_DIR = "results/binding_replicate"
AXES = ("lambda", "seed")


def replicate_cells(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per run of the replicate series: ``series``, ``dose``, ``seed``, ``run`` and
    ``model`` (named like the run)."""
    records = []
    for name, declared, existing in named_series(config, "binding_replicate.series", "its runs"):
        if set(declared.get("axes") or {}) != set(AXES) or existing:
            raise ConfigError(
                f"series.{name}: a replicate has exactly the axes {list(AXES)} and no existing "
                f"runs (every run carries the null push); it has axes "
                f"{sorted(declared.get('axes') or {})} and existing {sorted(existing)}"
            )
        for cell in series_cells(name, declared):
            records.append(
                {
                    "series": name,
                    "dose": float(cell["run"].get("hparams", {}).get("slot_weight", 0.0)),
                    "seed": int(cell["values"]["seed"]),
                    "run": cell["name"],
                    "model": cell["name"],
                }
            )
    return records


def replicate_models(config: Mapping[str, Any]) -> list[str]:
    """The replicate's models: built by ``binding_replicate``, not by ``binding``."""
    return sorted({cell["model"] for cell in replicate_cells(config)})


def check_replicate_config(config: Mapping[str, Any]) -> None:
    """Every replicate run is a zoo model whose push is negligible (registered in
    config_checks())."""
    models = config.get("models") or {}
    for cell in replicate_cells(config):
        where = f"series.{cell['series']} (lambda {cell['dose']:g}, seed {cell['seed']})"
        entry = models.get(cell["model"])
        if entry is None or entry.get("source") != "zoo" or entry.get("id") != cell["run"]:
            raise ConfigError(f"{where}: no zoo model {cell['model']!r} in models")
        weight = float(
            (run_spec(config, cell["run"]).get("jer_regulariser") or {}).get("weight") or 0
        )
        if not 0 < abs(weight) <= NULL_MAX_WEIGHT:
            raise ConfigError(
                f"{where}: jer_regulariser.weight is {weight}; every replicate run carries the "
                f"null push (0 < |weight| <= {NULL_MAX_WEIGHT}), so that it is another draw of "
                "the same design"
            )
