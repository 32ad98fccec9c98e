"""The checks that packages above the core register, and the one call that says which packages.

The core names no package above it. Each package whose config needs checks the JSON schema cannot
state returns them, as the functions themselves, from functions of its ``__init__`` that import
them when called (so importing a package imports no check): ``config_checks()`` (across keys,
e.g. more candidates than arrangements; each takes the whole config and raises
:class:`~repdiag.core.errors.ConfigError` naming the key), and optionally ``build_checks()``
(architectures built on the meta device: nothing read or downloaded) and ``weights_checks()``
(weights files, hub folders, library caches), each check taking the config and the keys of the
models with jobs to run (None: all). Which packages, in which order, is said once, above the core, by
:func:`register_packages`, through ``repdiag.studies.register``, which each entry point calls.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from repdiag.core.errors import RepdiagError

Check = Callable[..., None]
"""A registered check: ``check(config)`` (config checks) or ``check(config, models)`` (pre-run)."""

_PACKAGES: list[str] = []


def register_packages(packages: Iterable[str]) -> None:
    """Set the packages whose registered checks run, in the order they run (replaces any earlier
    list). Called by ``repdiag.studies.register``, above every layer."""
    _PACKAGES[:] = list(dict.fromkeys(packages))


def checked_packages() -> tuple[str, ...]:
    """The packages set by :func:`register_packages`; an error if none were (a check skipped for
    want of a list would pass a bad config)."""
    if not _PACKAGES:
        raise RepdiagError(
            "no packages registered for config checks: call repdiag.studies.register() first "
            "(the Snakefile, the repdiag CLI and repdiag.load_config do)"
        )
    return tuple(_PACKAGES)


def resolve(reference: str) -> Callable:
    """The function a ``"package.module:function"`` reference names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def _registered(kind: str) -> tuple[Check, ...]:
    """The checks each package's ``kind()`` returns (none where it has no such function)."""
    return tuple(
        check
        for package in checked_packages()
        for check in getattr(importlib.import_module(package), kind, tuple)()
    )


def semantic_checks() -> tuple[Check, ...]:
    """Every package's registered cross-key checks (``config_checks()``), package by package."""
    return _registered("config_checks")


# Checks that import torch or read local files, too slow or too strict for every parse of the
# workflow (a dry run plans a config whose weights live on another machine). `repdiag validate`
# runs them (the weights checks unless --no-weights); a real run's ``onstart`` (rules/common.smk)
# runs both on the models with jobs, before the first job starts.
RUN_CHECK_KINDS: tuple[str, ...] = ("weights_checks", "build_checks")


def run_checks(*, build: bool = True, weights: bool = True) -> tuple[Check, ...]:
    """Every package's registered pre-run checks, weights checks first (they are the cheap ones)."""
    kinds = [kind for kind, on in zip(RUN_CHECK_KINDS, (weights, build), strict=True) if on]
    return tuple(check for kind in kinds for check in _registered(kind))


def check_before_run(
    config: Mapping[str, Any],
    models: Iterable[str] | None = None,
    *,
    build: bool = True,
    weights: bool = True,
    passed: Path | None = None,
) -> None:
    """Run the pre-run checks (:func:`run_checks`) on ``models`` (default: every model) of a
    validated config; each raises a :class:`~repdiag.core.errors.RepdiagError` naming the key.

    ``passed``: a folder where the build checks remember the models they passed
    (:func:`build_check_key`). A model whose key is there is not built again: its build checks
    are a function of that key alone, and building imports torch and the model libraries
    (seconds at every run's start). The weights checks always run: files change without the
    config changing."""
    models = None if models is None else set(models)
    for check in run_checks(build=False, weights=weights):
        check(config, models)
    if not build:
        return
    if passed is None:
        for check in run_checks(build=True, weights=False):
            check(config, models)
        return
    chosen = set(config.get("models") or {}) if models is None else models
    keys = {key: build_check_key(config, key) for key in chosen}
    todo = {key for key in chosen if not (passed / keys[key]).is_file()}
    if todo:
        for check in run_checks(build=True, weights=False):
            check(config, todo)
        _remember(passed, [keys[key] for key in todo])


def build_check_key(config: Mapping[str, Any], model: str) -> str:
    """What the build checks of ``model`` depend on, hashed: the config with only this model
    under ``models`` (any other change of the config also changes the key: conservative), the
    packages whose checks run, repdiag's own source and schemas (which hold each package's
    ``build_checks()`` and the checks themselves, so the key needs no check imported: importing
    them imports torch, which a run whose models all passed before never needs), and the
    versions of the libraries that build models. The build checks build library architectures
    only (a ``python`` or ``hub`` entry runs the user's code, so its job builds it: tested in
    tests/core/test_checks.py), so the key covers everything they read."""
    entry = (config.get("models") or {}).get(model) or {}
    what = [
        {**config, "models": {model: entry}},
        checked_packages(),
        _source_digest(),
        _library_versions(),
    ]
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


BUILDING_LIBRARIES = ("torch", "torchvision", "timm", "open_clip_torch")


@functools.cache
def _library_versions() -> tuple[str, ...]:
    versions = []
    for name in BUILDING_LIBRARIES:
        try:
            versions.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    return tuple(versions)


@functools.cache
def _source_digest() -> str:
    """sha256 over repdiag's Python files and the schemas, by path and content."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    files = [*package.rglob("*.py"), *(package.parent / "schemas").glob("*.yaml")]
    for path in sorted(files):
        digest.update(str(path.relative_to(package.parent)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _remember(folder: Path, keys: Iterable[str]) -> None:
    """One empty file per passed key; an unwritable folder only costs the next run a build."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for key in keys:
            partial = folder / f".{key}.{os.getpid()}.tmp"
            partial.write_bytes(b"")
            partial.replace(folder / key)
    except OSError:
        pass
