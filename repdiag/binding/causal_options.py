"""The ``binding_causal`` config section: which regularised models are compared with which.

Read while Snakemake parses the workflow (rules/common.smk, the config checks), so it imports
neither torch nor the analysis modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repdiag.common.families import JER_INTERVENTION_FAMILY
from repdiag.core.errors import ConfigError
from repdiag.encoders.zoo.spec import run_spec

SPEC_KEYS_MANIPULATED = ("run", "family", "jer_regulariser")
"""What a regularised run's spec may differ in from its baseline's: nothing else is manipulated."""


def comparisons(config: Mapping[str, Any]) -> dict[str, str]:
    """``binding_causal.comparisons``: regularised model -> its unregularised model."""
    return dict((config.get("binding_causal") or {}).get("comparisons") or {})


def causal_models(config: Mapping[str, Any]) -> list[str]:
    """The regularised models of ``binding_causal``: built by that target, not by ``binding``."""
    return sorted(comparisons(config))


def _zoo_run(config: Mapping[str, Any], key: str, role: str, where: str) -> str:
    models = config.get("models") or {}
    if key not in models:
        raise ConfigError(
            f"{where}: {role} {key!r} is not in models (has {len(models)} models); add it there"
        )
    entry = models[key]
    if entry.get("source") != "zoo":
        raise ConfigError(
            f"{where}: {role} {key!r} has source {entry.get('source')!r}; a JER intervention "
            "compares zoo runs the workflow trains (source: zoo)"
        )
    return str(entry["id"])


def check_causal_config(config: Mapping[str, Any]) -> None:
    """Each comparison pairs a JER-regularised zoo run with the run it would be without the
    regulariser: same spec apart from ``jer_regulariser`` (registered in CONFIG_CHECKS)."""
    pairs = comparisons(config)
    baselines = set(pairs.values())
    for model, baseline in pairs.items():
        where = f"binding_causal.comparisons.{model}"
        run = _zoo_run(config, model, "the regularised model", where)
        base_run = _zoo_run(config, baseline, "the baseline", where)
        if model in baselines:
            raise ConfigError(f"{where}: {model!r} is also a baseline; compare with a plain run")
        spec, base = run_spec(config, run), run_spec(config, base_run)
        if not spec["jer_regulariser"].get("weight"):
            raise ConfigError(
                f"{where}: zoo run {run!r} has no JER regulariser; set "
                f"zoo.objectives.{run}.jer_regulariser.weight to a non-zero strength"
            )
        if base["jer_regulariser"].get("weight"):
            raise ConfigError(
                f"{where}: the baseline's zoo run {base_run!r} is regularised itself; compare "
                "with the run without jer_regulariser"
            )
        differing = sorted(
            key
            for key in set(spec) | set(base)
            if key not in SPEC_KEYS_MANIPULATED and spec.get(key) != base.get(key)
        )
        if differing:
            raise ConfigError(
                f"{where}: zoo runs {run!r} and {base_run!r} differ in {differing}, not only in "
                "jer_regulariser; make them equal so that the JER is all that was manipulated"
            )
        family = (config.get("models") or {})[model].get("family")
        if family != JER_INTERVENTION_FAMILY:
            raise ConfigError(
                f"models.{model}.family is {family!r}; a regularised run has family "
                f"{JER_INTERVENTION_FAMILY!r}"
            )
