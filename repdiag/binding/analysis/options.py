"""Options of the statistics stage: resolved settings and the config checks JSON schema cannot express.

Kept free of heavy imports (no scipy, statsmodels, pandas): the Snakefile runs
:func:`check_stats_config` on every parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig

READOUTS = ("cosine", "knn", "local_pca")
JER_FORMULAS = ("pr", "pr2", "entropy")
JER_SUMMARIES = ("final", "max")
GEOMETRY = ("g_pr", "g_iso", "effective_rank", "participation_ratio")


@dataclass(frozen=True)
class StatsSettings(FromConfig):
    """The ``stats`` config section (every value from the config or the schema's default,
    schemas/stats.schema.yaml, none from here). ``seed: null`` is resolved to the global seed
    once, by the rules that hand the section to a job (``seeded`` in rules/binding/*.smk); a
    statistic that draws refuses it unresolved (:attr:`draw_seed`)."""

    SECTION: ClassVar[str] = "stats"
    n_bootstrap: int
    seed: int | None
    confidence: float
    min_models: int
    readout: str
    binding_score: str
    jer_formula: str
    jer_at: str
    probe_set: str
    covariates: tuple[str, ...]
    collapse_threshold: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "covariates", tuple(self.covariates))

    @property
    def draw_seed(self) -> int:
        """The seed of every bootstrap and permutation draw: ``seed``, resolved."""
        if not isinstance(self.seed, int):
            raise ConfigError(
                f"stats.seed is {self.seed!r}: resolve it to an integer before drawing (the "
                "workflow's rules put the global seed in for null)"
            )
        return self.seed

    @property
    def jer_column(self) -> str:
        return f"jer_{self.jer_formula}_{self.jer_at}"

    @property
    def binding_column(self) -> str:
        """``binding_<readout>`` (accuracy) or ``binding_<readout>_win`` (win rate)."""
        suffix = "_win" if self.binding_score == "win_rate" else ""
        return f"binding_{self.readout}{suffix}"

    @property
    def binding_label(self) -> str:
        """The headline binding score in words, for axis labels."""
        score = "win rate" if self.binding_score == "win_rate" else "accuracy"
        return f"binding {score}, {self.readout}"

    def options(self) -> dict[str, Any]:
        """Keyword arguments shared by every bootstrapped statistic."""
        return {
            "n_boot": self.n_bootstrap,
            "seed": self.draw_seed,
            "confidence": self.confidence,
            "min_models": self.min_models,
        }


RESERVED_PREFIXES = ("binding", "jer", "l_iso", "same_different")


def covariate_columns(models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every covariate name any model declares, sorted; names that clash with metrics are refused."""
    names = sorted({name for entry in models.values() for name in entry.get("covariates", {})})
    reserved = {"model", "family", "source", "final_layer", "n_layers", "chance", *GEOMETRY}
    for name in names:
        if name in reserved or name.startswith(RESERVED_PREFIXES):
            owner = next(k for k, e in models.items() if name in e.get("covariates", {}))
            raise ConfigError(
                f"models.{owner}.covariates.{name}: the name clashes with a metric column of the "
                "models table; rename the covariate"
            )
    return names


def check_stats_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of the ``stats`` section (registered in ``repdiag.binding.config_checks()``).

    Each covariate must be given by at least one model, and the headline readout must be one the
    metrics stage computes.
    """
    section = config.get("stats") or {}
    models = config.get("models") or {}
    for name in section.get("covariates", []):
        if not any(name in (entry.get("covariates") or {}) for entry in models.values()):
            raise ConfigError(
                f"stats.covariates: {name!r} is not a covariate of any model; add it as "
                f"models.<key>.covariates.{name} or remove it from stats.covariates"
            )
    if models:
        covariate_columns(models)
    computed = ((config.get("metrics") or {}).get("readouts") or {}).get("names")
    readout = StatsSettings.from_config(section).readout
    if computed is not None and readout not in computed:
        raise ConfigError(
            f"stats.readout: {readout!r} is not computed by the metrics stage "
            f"(metrics.readouts.names = {computed}); add it there or choose one of them"
        )
