"""The one list of studies, above every layer: which packages are studies, which packages' config
checks run, what the workflow builds for each study, and the `repdiag` subcommands packages add.

Imports point down (core -> common -> encoders -> studies) and the core names no package above
it, so what it must know of them is said here and handed down: :data:`CHECKED_PACKAGES` through
:func:`register`, which every entry point calls (the Snakefile, :mod:`repdiag.cli`,
:func:`repdiag.api.load_config`; the test suite's conftest), :data:`COMMANDS` to :mod:`repdiag.cli`, and
:data:`TARGETS` and :func:`final_outputs` to the workflow (the Snakefile's `rule all` and rule per
target; rules/common.smk's ``priority_of``). Every name here is a string: importing this module imports no study.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repdiag.core.checks import register_packages

STUDIES: tuple[str, ...] = ("binding", "alignment", "identifiability", "cifar", "sugarcrepe")
"""The study packages (``repdiag.<study>``): each imports the shared layers, never another study."""

CHECKED_PACKAGES: tuple[str, ...] = ("repdiag.encoders", *(f"repdiag.{s}" for s in STUDIES))
"""Packages whose ``config_checks()``, ``build_checks()`` and ``weights_checks()`` run, in this order
(:mod:`repdiag.core.checks`): the encoders layer (models, embeddings, zoo, Jacobians), then each
study."""


@dataclass(frozen=True)
class Target:
    """A workflow target: `snakemake <name>` builds the final outputs of one part of a study."""

    name: str
    study: str
    """The study package whose results it builds."""
    on_request: bool = False
    """Built only when named (an intervention or a check on top of a study), not by `rule all`."""
    priority: int = 0
    """Snakemake priority of the jobs of its stages: higher runs first when jobs compete."""


TARGETS: tuple[Target, ...] = (
    # the main study first: its figures and results/summary.md arrive before the others finish
    Target("binding", "binding", priority=10),
    Target("binding_causal", "binding", on_request=True),  # the JER intervention
    Target("binding_families", "binding", on_request=True),  # the objectives at 3000 steps
    Target("binding_replicate", "binding", on_request=True),  # the dose series drawn again
    Target("identifiability", "identifiability"),
    Target("identifiability_check", "identifiability", on_request=True),  # the authors' runs
    Target("alignment", "alignment"),
    Target("cifar", "cifar"),
    Target("sugarcrepe", "sugarcrepe"),
)
"""Every workflow target, each once: `rule all` builds those not ``on_request``."""

COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": (
        "repdiag.encoders.zoo.calibrate:main",
        "the share of the AdamW step a unit-weight push of each term takes (the causal pilot)",
    ),
    "plan": (
        "repdiag.encoders.jacobian.plan_print:command",
        "Jacobian work, memory per pass and projected time of a config (offline, no weights)",
    ),
}
"""`repdiag <name>` subcommands a package provides: ``name: ("module:function", help)``, resolved
when the command runs; ``function(argv)`` parses its own arguments."""


def target(name: str) -> Target:
    """The workflow target called ``name``."""
    for candidate in TARGETS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no workflow target {name!r}; the targets are {[t.name for t in TARGETS]}")


def final_outputs(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every workflow target's final outputs, ``{target: [paths]}``, from the validated config
    alone (the workflow catalog's ``get_final_output``): what `snakemake <target>` builds, each
    study's part given by ``repdiag.<study>.outputs.final_outputs``. The Snakefile's `rule all`
    and its rule per target read only this."""
    outputs: dict[str, list[str]] = {}
    for study in STUDIES:
        module = importlib.import_module(f"repdiag.{study}.outputs")
        for name, paths in module.final_outputs(config).items():
            if target(name).study != study:
                raise ValueError(f"repdiag.{study}.outputs names target {name!r} of another study")
            outputs[name] = list(paths)
    missing = [entry.name for entry in TARGETS if entry.name not in outputs]
    if missing:
        raise ValueError(f"no study gives the final outputs of targets {missing}")
    for name, paths in outputs.items():
        if any("{" in path for path in paths) or len(set(paths)) != len(paths):
            raise ValueError(f"final outputs of {name} repeat a path or hold wildcards: {paths}")
    return {entry.name: outputs[entry.name] for entry in TARGETS}


def default_outputs(outputs: Mapping[str, list[str]]) -> list[str]:
    """What `rule all` builds: of :func:`final_outputs`' ``outputs``, those of every target not
    built on request only."""
    return [path for entry in TARGETS if not entry.on_request for path in outputs[entry.name]]


def register() -> None:
    """Hand the core the packages whose config checks run (:data:`CHECKED_PACKAGES`): called
    explicitly by every entry point, never as a side effect of an import."""
    register_packages(CHECKED_PACKAGES)
