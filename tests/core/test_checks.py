"""The registry of checks packages above the core contribute, and the pre-run checks."""

from __future__ import annotations

import pytest

from repdiag.core import checks
from repdiag.core.errors import RepdiagError


def test_the_packages_come_from_one_registration_above_the_core(monkeypatch) -> None:
    from repdiag.studies import CHECKED_PACKAGES

    assert checks.checked_packages() == CHECKED_PACKAGES  # registered when repdiag is imported
    monkeypatch.setattr(checks, "_PACKAGES", [])
    with pytest.raises(RepdiagError, match="no packages registered for config checks"):
        checks.semantic_checks()
    checks.register_packages(["repdiag.encoders", "repdiag.encoders"])
    assert checks.checked_packages() == ("repdiag.encoders",)
    assert checks.semantic_checks()[0] == "repdiag.encoders.entries:check_models"
    assert checks.resolve("repdiag.core.checks:resolve") is checks.resolve


def test_pre_run_checks_are_registered_by_package_weights_first() -> None:
    """Checks that import torch or read local files run before a real run's first job and in
    `repdiag validate`, not on every parse (reliability README, hardening cases 10 and 14)."""
    import importlib

    from repdiag.core.checks import checked_packages, resolve, run_checks

    every = run_checks()
    assert every[0] == "repdiag.encoders.registry:check_weights_available"
    assert "repdiag.encoders.zoo.prerun:check_zoo_backbones" in every
    assert "repdiag.binding.prerun:check_jacobian_layers" in every
    assert run_checks(weights=False) == every[1:]
    assert run_checks(build=False) == every[:1]
    for reference in every:
        assert callable(resolve(reference)), reference
    for package in checked_packages():
        module = importlib.import_module(package)
        for kind in ("BUILD_CHECKS", "WEIGHTS_CHECKS"):
            for reference in getattr(module, kind, ()):
                assert reference.startswith(package + "."), reference


def test_check_before_run_passes_the_models_with_jobs(monkeypatch) -> None:
    import repdiag.encoders

    seen = []
    monkeypatch.setattr(checks, "run_checks", lambda **kinds: ("builtins:print",))
    monkeypatch.setattr("builtins.print", lambda config, models: seen.append((config, models)))
    checks.check_before_run({"a": 1}, ["m", "m", "n"])
    checks.check_before_run({"a": 1})
    assert seen == [({"a": 1}, {"m", "n"}), ({"a": 1}, None)]
    assert repdiag.encoders.WEIGHTS_CHECKS  # the registry the real run_checks reads
