"""The registry of checks packages above the core contribute, and the pre-run checks."""

from __future__ import annotations

import pytest

from repdiag.core import checks
from repdiag.core.errors import RepdiagError


def check_name(check) -> str:
    """``"package.module:function"``: a registered check by name."""
    return f"{check.__module__}:{check.__qualname__}"


def test_the_packages_come_from_one_registration_above_the_core(monkeypatch) -> None:
    from repdiag.studies import CHECKED_PACKAGES

    assert checks.checked_packages() == CHECKED_PACKAGES  # registered by the suite (conftest)
    monkeypatch.setattr(checks, "_PACKAGES", [])
    with pytest.raises(RepdiagError, match="no packages registered for config checks"):
        checks.semantic_checks()
    checks.register_packages(["repdiag.encoders", "repdiag.encoders"])
    assert checks.checked_packages() == ("repdiag.encoders",)
    from repdiag.encoders.entries import check_models

    assert checks.semantic_checks()[0] is check_models
    assert checks.resolve("repdiag.core.checks:resolve") is checks.resolve


def test_pre_run_checks_are_registered_by_package_weights_first() -> None:
    """Checks that import torch or read local files run before a real run's first job and in
    `repdiag validate`, not on every parse (reliability README, hardening cases 10 and 14)."""
    import importlib

    from repdiag.core.checks import checked_packages, run_checks

    every = [check_name(check) for check in run_checks()]
    assert every[0] == "repdiag.encoders.available:check_weights_available"
    assert "repdiag.encoders.zoo.prerun:check_zoo_backbones" in every
    assert "repdiag.binding.prerun:check_jacobian_layers" in every
    assert [check_name(check) for check in run_checks(weights=False)] == every[1:]
    assert [check_name(check) for check in run_checks(build=False)] == every[:1]
    for package in checked_packages():  # each package registers its own checks only
        module = importlib.import_module(package)
        for kind in ("build_checks", "weights_checks"):
            for check in getattr(module, kind, tuple)():
                assert check.__module__.startswith(package + "."), check_name(check)


def test_check_before_run_passes_the_models_with_jobs(monkeypatch) -> None:
    import repdiag.encoders

    seen = []

    def record(config, models):
        seen.append((config, models))

    monkeypatch.setattr(checks, "run_checks", lambda **kinds: (record,))
    checks.check_before_run({"a": 1}, ["m", "m", "n"])
    checks.check_before_run({"a": 1})
    # once as the weights checks, once as the build checks (run_checks is asked for each kind)
    assert seen == [({"a": 1}, {"m", "n"})] * 2 + [({"a": 1}, None)] * 2
    assert repdiag.encoders.weights_checks()  # the registry the real run_checks reads


def recording_checks(monkeypatch) -> list[tuple[str, set[str] | None]]:
    """run_checks replaced by one weights check and one build check that record their models."""
    calls: list[tuple[str, set[str] | None]] = []

    def recorder(kind: str):
        def check(config, models):
            calls.append((kind, None if models is None else set(models)))

        return check

    weights_check, build_check = recorder("weights"), recorder("build")

    def fake_run_checks(*, build: bool = True, weights: bool = True) -> tuple:
        return ((weights_check,) if weights else ()) + ((build_check,) if build else ())

    monkeypatch.setattr(checks, "run_checks", fake_run_checks)
    return calls


ZOO = {"source": "zoo", "id": "a"}
CONFIG = {"models": {"a": ZOO, "b": {"source": "timm", "id": "resnet10t"}}, "seed": 0}


def test_a_model_whose_build_checks_passed_is_not_built_again(monkeypatch, tmp_path) -> None:
    calls = recording_checks(monkeypatch)
    passed = tmp_path / "passed"
    checks.check_before_run(CONFIG, ["a", "b"], passed=passed)
    checks.check_before_run(CONFIG, ["a", "b"], passed=passed)  # both remembered
    checks.check_before_run({**CONFIG, "seed": 1}, ["a"], passed=passed)  # another config
    assert calls == [
        ("weights", {"a", "b"}),
        ("build", {"a", "b"}),
        ("weights", {"a", "b"}),  # files change without the config changing: always checked
        ("weights", {"a"}),
        ("build", {"a"}),
    ]
    assert len(list(passed.iterdir())) == 3


def test_a_failed_build_check_is_not_remembered(monkeypatch, tmp_path) -> None:
    def failing(config, models):
        raise RepdiagError("no")

    monkeypatch.setattr(checks, "run_checks", lambda **kinds: (failing,) if kinds["build"] else ())
    with pytest.raises(RepdiagError):
        checks.check_before_run(CONFIG, ["a"], passed=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_key_is_the_model_its_config_the_code_and_the_libraries() -> None:
    key = checks.build_check_key(CONFIG, "a")
    assert key == checks.build_check_key(CONFIG, "a") and len(key) == 64
    assert key != checks.build_check_key(CONFIG, "b")
    # another model's entry is not part of the key; any other key of the config is
    assert key == checks.build_check_key({**CONFIG, "models": {"a": ZOO}}, "a")
    assert key != checks.build_check_key({**CONFIG, "seed": 1}, "a")
    assert key != checks.build_check_key({**CONFIG, "models": {"a": {**ZOO, "id": "c"}}}, "a")
    assert "timm==" in " ".join(checks._library_versions())


def test_the_key_imports_no_check_so_a_remembered_run_starts_without_torch(monkeypatch) -> None:
    """Computing keys (all that a run whose models all passed before does) imports none of the
    build checks, which import torch; a change of the registered packages changes the key."""
    import subprocess
    import sys

    code = (
        "import sys, repdiag.studies as s; s.register()\n"
        "from repdiag.core.checks import build_check_key\n"
        "build_check_key({'models': {'a': {'source': 'timm', 'id': 'resnet10t'}}}, 'a')\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    key = checks.build_check_key(CONFIG, "a")
    monkeypatch.setattr(checks, "_PACKAGES", ["repdiag.encoders"])
    assert checks.build_check_key(CONFIG, "a") != key


def test_the_build_checks_never_build_the_users_code() -> None:
    """The key of a remembered build check covers the config, repdiag and the libraries, not the
    code a python or hub entry imports: no build check may build those sources (their jobs do)."""
    from repdiag.binding.prerun import TAPS_CHECKED_SOURCES
    from repdiag.encoders.factory import SIZE_CHECKED_SOURCES

    assert tuple(map(check_name, checks.run_checks(build=True, weights=False))) == (
        "repdiag.encoders.zoo.prerun:check_zoo_backbones",
        "repdiag.encoders.factory:check_model_sizes",
        "repdiag.binding.control_options:check_controls_config",  # reads entries, builds none
        "repdiag.binding.prerun:check_jacobian_layers",
    )
    for sources in (TAPS_CHECKED_SOURCES, SIZE_CHECKED_SOURCES):
        assert not {"python", "hub"} & sources
