"""The checks that packages above the core register, and the one call that says which packages.

The core names no package above it. Each package whose config needs checks the JSON schema cannot
state lists them in its ``__init__`` as ``"module:function"`` references: ``CONFIG_CHECKS`` (across
keys, e.g. more candidates than arrangements; each takes the whole config and raises
:class:`~repdiag.core.errors.ConfigError` naming the key), and optionally ``BUILD_CHECKS``
(architectures built on the meta device: nothing read or downloaded) and ``WEIGHTS_CHECKS``
(weights files, hub folders, library caches), each taking the config and the keys of the models
with jobs to run (None: all). Which packages, in which order, is said once, above the core, by
:func:`register_packages` (``repdiag.studies``, imported with the ``repdiag`` package).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from repdiag.core.errors import RepdiagError

_PACKAGES: list[str] = []


def register_packages(packages: Iterable[str]) -> None:
    """Set the packages whose registered checks run, in the order they run (replaces any earlier
    list). Called by ``repdiag.studies``, the top-level module that lists the studies."""
    _PACKAGES[:] = list(dict.fromkeys(packages))


def checked_packages() -> tuple[str, ...]:
    """The packages set by :func:`register_packages`; an error if none were (a check skipped for
    want of a list would pass a bad config)."""
    if not _PACKAGES:
        raise RepdiagError(
            "no packages registered for config checks: repdiag.studies registers them when the "
            "repdiag package is imported (repdiag.core.checks.register_packages)"
        )
    return tuple(_PACKAGES)


def resolve(reference: str) -> Callable:
    """The function a ``"package.module:function"`` reference names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def semantic_checks() -> tuple[str, ...]:
    """Every package's registered cross-key checks (``CONFIG_CHECKS``), package by package."""
    return tuple(
        reference
        for package in checked_packages()
        for reference in importlib.import_module(package).CONFIG_CHECKS
    )


# Checks that import torch or read local files, too slow or too strict for every parse of the
# workflow (a dry run plans a config whose weights live on another machine). `repdiag validate`
# runs them (the weights checks unless --no-weights); a real run's ``onstart`` (rules/common.smk)
# runs both on the models with jobs, before the first job starts.
RUN_CHECK_KINDS: tuple[str, ...] = ("WEIGHTS_CHECKS", "BUILD_CHECKS")


def run_checks(*, build: bool = True, weights: bool = True) -> tuple[str, ...]:
    """Every package's registered pre-run checks, weights checks first (they are the cheap ones)."""
    kinds = [kind for kind, on in zip(RUN_CHECK_KINDS, (weights, build), strict=True) if on]
    return tuple(
        reference
        for kind in kinds
        for package in checked_packages()
        for reference in getattr(importlib.import_module(package), kind, ())
    )


def check_before_run(
    config: Mapping[str, Any],
    models: Iterable[str] | None = None,
    *,
    build: bool = True,
    weights: bool = True,
) -> None:
    """Run the pre-run checks (:func:`run_checks`) on ``models`` (default: every model) of a
    validated config; each raises a :class:`~repdiag.core.errors.RepdiagError` naming the key."""
    models = None if models is None else set(models)
    for reference in run_checks(build=build, weights=weights):
        resolve(reference)(config, models)
