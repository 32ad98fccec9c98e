"""The one list of studies, above every layer: which packages are studies, which packages' config
checks run, what the workflow builds for each study, and the `repdiag` subcommands packages add.

Imports point down (core -> common -> encoders -> studies) and the core names no package above
it, so what it must know of them is said here and handed down: :data:`CHECKED_PACKAGES` through
:func:`repdiag.core.checks.register_packages` (called below; the ``repdiag`` package imports this
module, so every entry point registers them), :data:`COMMANDS` to :mod:`repdiag.cli`, and
:data:`TARGETS` to the workflow (rules/common.smk: ``final_targets``, ``priority_of``; the
Snakefile's rule per target). Every name here is a string: importing this module imports no study.
"""

from __future__ import annotations

from dataclasses import dataclass

from repdiag.core.checks import register_packages

STUDIES: tuple[str, ...] = ("binding", "alignment", "identifiability", "cifar", "sugarcrepe")
"""The study packages (``repdiag.<study>``): each imports the shared layers, never another study."""

CHECKED_PACKAGES: tuple[str, ...] = ("repdiag.encoders", *(f"repdiag.{s}" for s in STUDIES))
"""Packages whose ``CONFIG_CHECKS``, ``BUILD_CHECKS`` and ``WEIGHTS_CHECKS`` run, in this order
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
    Target("identifiability", "identifiability"),
    Target("identifiability_check", "identifiability", on_request=True),  # the authors' runs
    Target("alignment", "alignment"),
    Target("cifar", "cifar"),
    Target("sugarcrepe", "sugarcrepe"),
)
"""Every workflow target, each once: `rule all` builds those not ``on_request``."""

COMMANDS: dict[str, tuple[str, str]] = {
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


register_packages(CHECKED_PACKAGES)
