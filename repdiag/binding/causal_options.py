"""The ``binding_causal`` config section: the arms of the JER intervention, per base and seed.

Each base is a series (config key ``series``, :mod:`repdiag.core.series`) with an ``arm`` axis of
patches and a ``seed`` axis: ``plain`` (no regulariser; usually an existing run of the dose
series stands in for it), ``raise`` (``jer_regulariser.weight`` > 0), ``lower`` (< 0) and
``sham`` (the same |weight| with ``sham: true``: a random sign each step, so the same gradient
norm and no net push on JER). ``binding_causal.series`` names the bases to compare. Within a seed
every arm's run equals the plain run apart from ``jer_regulariser``, and the three regularised
arms share |weight|: nothing else is manipulated.

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
from repdiag.encoders.zoo.spec import run_spec

ARMS = ("plain", "raise", "lower", "sham")
"""The arms of a base, in table order. A base needs plain and sham and at least one of raise and
lower (the default config has all four)."""

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
                }
            )
    return records


def causal_models(config: Mapping[str, Any]) -> list[str]:
    """The regularised models (raise, lower, sham): built by ``binding_causal``, not ``binding``.
    The plain arms are the main study's runs (the dose series)."""
    return sorted({cell["model"] for cell in causal_cells(config) if cell["arm"] != "plain"})


def causal_members(config: Mapping[str, Any]) -> list[str]:
    """Every model the causal analysis reads: each arm's, plain included, once."""
    return sorted({cell["model"] for cell in causal_cells(config)})


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
    """The arm's |weight|, after checking its sign and sham flag fit the arm."""
    weight = float(regulariser.get("weight") or 0.0)
    sham = bool(regulariser.get("sham"))
    expected = {
        "plain": weight == 0.0,
        "raise": weight > 0 and not sham,
        "lower": weight < 0 and not sham,
        "sham": weight != 0 and sham,
    }[arm]
    if not expected:
        raise ConfigError(
            f"{where}: the {arm} arm has jer_regulariser {dict(regulariser)}; plain has weight 0, "
            "raise weight > 0, lower weight < 0, sham weight != 0 with sham: true"
        )
    return abs(weight)


def _check_seed(config: Mapping[str, Any], base: str, seed: int, arms: Mapping[str, str]) -> None:
    where = f"series.{base} seed {seed}"
    missing = {"plain", "sham"} - set(arms)
    if missing or not {"raise", "lower"} & set(arms):
        raise ConfigError(
            f"series.{base}.axes.arm: has {sorted(arms)}; a causal base needs plain, sham and "
            "at least one of raise and lower"
        )
    plain = run_spec(config, arms["plain"])
    weights = set()
    for arm, run in arms.items():
        spec = run_spec(config, run)
        weights.add(_check_regulariser(f"{where}: run {run!r}", arm, spec["jer_regulariser"]))
        differing = sorted(
            key
            for key in set(spec) | set(plain)
            if key not in SPEC_KEYS_MANIPULATED and spec.get(key) != plain.get(key)
        )
        if differing:
            raise ConfigError(
                f"{where}: runs {run!r} ({arm}) and {arms['plain']!r} (plain) differ in "
                f"{differing}, not only in jer_regulariser; make them equal so that the JER "
                "term is all that was manipulated"
            )
    weights.discard(0.0)
    if len(weights) > 1:
        raise ConfigError(
            f"{where}: the regularised arms have |weight| {sorted(weights)}; raise, lower and "
            "sham share one strength (the sham's gradient norm matches theirs)"
        )


def check_causal_config(config: Mapping[str, Any]) -> None:
    """Every base has plain and sham and raise or lower per seed, equal apart from the
    regulariser, at one |weight| (registered in CONFIG_CHECKS)."""
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
    """Per base, the run the recorded pilot measures: the lowest seed's raise run (else its
    lower run), whose |weight| is the base's strength; its plain trajectory is the pilot's."""
    runs = []
    for base in causal_series(config):
        cells = [c for c in causal_cells(config) if c["base"] == base]
        for arm in ("raise", "lower"):
            chosen = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["seed"])
            if chosen:
                runs.append(chosen[0]["run"])
                break
    return runs
