"""The ``binding_causal`` config section: the arms of the JER intervention, per base and seed.

Each base is a series (config key ``series``, :mod:`repdiag.core.series`) with an ``arm`` axis of
patches and a ``seed`` axis. The arms (``jer_regulariser`` of each, repdiag.encoders.zoo.regulariser):

- ``plain``: no term (weight 0);
- ``raise``: ``term: jer``, weight w > 0; ``lower``: ``term: jer``, weight < 0 (gentler, |w_l| <= w);
- ``sham``: ``term: direction_sham`` at the raise arm's w: a push as steady as the raise arm's
  that aims at neither JER nor the objective;
- ``geometry``: ``term: global_pr``, weight > 0: raises the final tap's G.PR instead;
- ``null``: any term at a negligible |weight| (<= :data:`NULL_MAX_WEIGHT`): the chaos floor.

``binding_causal.series`` names the bases. Within a seed every arm's run equals the plain run
apart from ``jer_regulariser``: nothing else is manipulated. A base needs plain, raise, sham and
null; lower and geometry are optional.

Read while Snakemake parses the workflow (rules/common.smk, the config checks), so it imports
neither torch nor the analysis modules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from repdiag.common.families import JER_INTERVENTION_FAMILY
from repdiag.core.errors import ConfigError
from repdiag.core.series import named_series, series_cells
from repdiag.encoders.zoo.spec import DEFAULT_TERM, NULL_MAX_WEIGHT, pushed_runs, run_spec

ARMS = ("plain", "raise", "lower", "sham", "geometry", "null")
"""The arms of a base, in table order."""

REQUIRED_ARMS = ("plain", "raise", "sham", "null")
"""The arms every seed of a base has: the contrasts are against plain, read against null."""


SPEC_KEYS_MANIPULATED = ("run", "family", "jer_regulariser")
"""What an arm's spec may differ in from its plain run's: nothing else is manipulated."""


def causal_series(config: Mapping[str, Any]) -> list[str]:
    """``binding_causal.series``: the series (bases) whose arms are compared."""
    return list((config.get("binding_causal") or {}).get("series") or [])


def causal_cells(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One record per (base, arm, seed): ``base`` (the series), ``dose`` (its slot_weight, NaN
    outside the dose series), ``arm``, ``seed``, ``run`` (the
    zoo run standing for the cell: the cell's own, or the existing run named for it) and
    ``model`` (the model of that run, named like it)."""
    records = []
    for base, declared, existing in named_series(config, "binding_causal.series", "its arms"):
        axes = declared.get("axes") or {}
        if "arm" not in axes or "seed" not in axes:
            raise ConfigError(
                f"series.{base}.axes: a causal base needs an `arm` axis (patches plain, raise, "
                f"lower, sham) and a `seed` axis; it has {sorted(axes)}"
            )
        for cell in series_cells(base, declared):
            run = existing.get(cell["name"], cell["name"])
            hparams = cell["run"].get("hparams") or {}
            records.append(
                {
                    "base": base,
                    "dose": float(hparams.get("slot_weight", math.nan)),
                    "arm": cell["labels"]["arm"],
                    "seed": int(cell["values"]["seed"]),
                    "run": run,
                    "model": run,
                    "own": run == cell["name"],
                }
            )
    return records


def causal_models(config: Mapping[str, Any]) -> list[str]:
    """The arms' own models (every arm, plain included, unless the series names an existing run
    for a cell): built by ``binding_causal``, not ``binding``, so that all arms of a seed are
    trained by the same target run, on the same machine and commit."""
    return sorted({cell["model"] for cell in causal_cells(config) if cell["own"]})


def causal_members(config: Mapping[str, Any]) -> list[str]:
    """Every model the causal analysis reads: each arm's, plain included, once."""
    return sorted({cell["model"] for cell in causal_cells(config)})


def causal_pushed(config: Mapping[str, Any]) -> list[str]:
    """The members whose run carries a push (every arm but plain): their cumulative push enters
    the displacement (rule causal_effects reads their push.safetensors)."""
    pushed = set(pushed_runs(config))
    return [cell["model"] for cell in causal_cells(config) if cell["run"] in pushed]


def _check_model(config: Mapping[str, Any], cell: Mapping[str, Any]) -> None:
    models = config.get("models") or {}
    where = f"series.{cell['base']} ({cell['arm']}, seed {cell['seed']})"
    entry = models.get(cell["model"])
    if entry is None or entry.get("source") != "zoo" or entry.get("id") != cell["run"]:
        raise ConfigError(
            f"{where}: no zoo model {cell['model']!r} of run {cell['run']!r} in models; a causal "
            "arm is a zoo run with a model of the same name"
        )
    if cell["arm"] != "plain" and entry.get("family") != JER_INTERVENTION_FAMILY:
        raise ConfigError(
            f"models.{cell['model']}.family is {entry.get('family')!r}; a regularised arm has "
            f"family {JER_INTERVENTION_FAMILY!r}"
        )


def _check_regulariser(where: str, arm: str, regulariser: Mapping[str, Any]) -> float:
    """The arm's signed weight, after checking its sign and term fit the arm."""
    weight = float(regulariser.get("weight") or 0.0)
    term = regulariser.get("term", DEFAULT_TERM)
    expected = {
        "plain": weight == 0.0,
        "raise": weight > 0 and term == "jer",
        "lower": weight < 0 and term == "jer",
        "sham": weight > 0 and term == "direction_sham",
        "geometry": weight > 0 and term == "global_pr",
        "null": 0 < abs(weight) <= NULL_MAX_WEIGHT,
    }[arm]
    if not expected:
        raise ConfigError(
            f"{where}: the {arm} arm has jer_regulariser {dict(regulariser)}; plain has weight "
            "0, raise term jer and weight > 0, lower term jer and weight < 0, sham term "
            "direction_sham and weight > 0, geometry term global_pr and weight > 0, null "
            f"0 < |weight| <= {NULL_MAX_WEIGHT}"
        )
    return weight


def _check_seed(config: Mapping[str, Any], base: str, seed: int, arms: Mapping[str, str]) -> None:
    where = f"series.{base} seed {seed}"
    missing = sorted(set(REQUIRED_ARMS) - set(arms))
    if missing:
        raise ConfigError(
            f"series.{base}.axes.arm: seed {seed} has {sorted(arms)}, lacks {missing}; a causal "
            f"base needs {', '.join(REQUIRED_ARMS)} (lower and geometry optional)"
        )
    plain = run_spec(config, arms["plain"])
    weights = {}
    for arm, run in arms.items():
        spec = run_spec(config, run)
        weights[arm] = _check_regulariser(
            f"{where}: run {run!r}", arm, spec.get("jer_regulariser") or {}
        )
        differing = sorted(
            key
            for key in set(spec) | set(plain)
            if key not in SPEC_KEYS_MANIPULATED and spec.get(key) != plain.get(key)
        )
        if differing:
            raise ConfigError(
                f"{where}: runs {run!r} ({arm}) and {arms['plain']!r} (plain) differ in "
                f"{differing}, not only in jer_regulariser; make them equal so that the term "
                "is all that was manipulated"
            )
    if weights["sham"] != weights["raise"]:
        raise ConfigError(
            f"{where}: the sham's weight {weights['sham']} is not the raise arm's "
            f"{weights['raise']}; the direction sham is sized by the raise arm's push"
        )
    if "lower" in weights and abs(weights["lower"]) > weights["raise"]:
        raise ConfigError(
            f"{where}: the lower arm's |weight| {abs(weights['lower'])} exceeds the raise "
            f"arm's {weights['raise']}; lowering is the gentler push (it costs the objective)"
        )


def check_causal_config(config: Mapping[str, Any]) -> None:
    """Every seed of a base has the required arms, equal apart from the regulariser, each with
    the term and sign of its arm (registered in config_checks())."""
    cells = causal_cells(config)
    by_seed: dict[tuple[str, int], dict[str, str]] = {}
    for cell in cells:
        if cell["arm"] not in ARMS:
            raise ConfigError(
                f"series.{cell['base']}.axes.arm: unknown arm {cell['arm']!r}; arms are "
                f"{', '.join(ARMS)}"
            )
        _check_model(config, cell)
        by_seed.setdefault((cell["base"], cell["seed"]), {})[cell["arm"]] = cell["run"]
    for (base, seed), arms in by_seed.items():
        _check_seed(config, base, seed, arms)


def calibration_runs(config: Mapping[str, Any]) -> list[str]:
    """Per base, the run the recorded pilot measures: the lowest seed's raise run; its plain
    trajectory is the pilot's."""
    runs = []
    for base in causal_series(config):
        raised = [c for c in causal_cells(config) if c["base"] == base and c["arm"] == "raise"]
        if raised:
            runs.append(min(raised, key=lambda c: c["seed"])["run"])
    return runs
