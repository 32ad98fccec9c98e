"""The one list of studies: packages, workflow targets and subcommands agree with the package and
the workflow."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from repdiag.studies import (
    CHECKED_PACKAGES,
    COMMANDS,
    STUDIES,
    TARGETS,
    default_outputs,
    final_outputs,
    target,
)
from tests.planning import resolved_config

ROOT = Path(__file__).resolve().parent.parent


def test_every_study_is_a_package_with_config_checks_and_a_target():
    for study in STUDIES:
        package = importlib.import_module(f"repdiag.{study}")
        assert f"repdiag.{study}" in CHECKED_PACKAGES
        checks = package.config_checks()
        assert all(check.__module__.startswith(f"repdiag.{study}.") for check in checks)
    assert CHECKED_PACKAGES[0] == "repdiag.encoders"  # models first: the studies name them
    assert {t.study for t in TARGETS} == set(STUDIES)


def test_targets_are_named_once_and_the_main_study_goes_first():
    names = [t.name for t in TARGETS]
    assert len(names) == len(set(names))
    assert target("binding").priority > max(t.priority for t in TARGETS if t.name != "binding")
    assert [t.name for t in TARGETS if t.on_request] == [
        "binding_causal",
        "binding_families",
        "binding_replicate",
        "identifiability_check",
    ]
    with pytest.raises(KeyError, match="no workflow target 'nope'"):
        target("nope")


def test_the_workflow_spells_no_study_list_of_its_own():
    """The Snakefile makes one rule per target from TARGETS; no stage file lists the studies."""
    workflow = [ROOT / "Snakefile", *sorted((ROOT / "rules").rglob("*.smk"))]
    for path in workflow:
        text = path.read_text()
        for name in (t.name for t in TARGETS):
            assert not re.search(rf"^rule {name}:", text, re.M), (path, name)
        assert "BINDING_PRIORITY" not in text and "ON_REQUEST" not in text, path


def test_commands_name_a_function_of_a_package():
    for name, (reference, help_text) in COMMANDS.items():
        module, _, function = reference.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name
        assert help_text, name


def test_final_outputs_give_every_target_and_all_leaves_the_on_request_ones_out():
    config = resolved_config()
    outputs = final_outputs(config)
    assert list(outputs) == [t.name for t in TARGETS]
    default = default_outputs(outputs)
    assert default == [p for t in TARGETS if not t.on_request for p in outputs[t.name]]
    assert "results/summary.md" in default and "results/tables/alignment.csv" in default
    assert "results/tables/identifiability_check.csv" not in default  # on request only
    assert "results/tables/identifiability_check.csv" in outputs["identifiability_check"]


def test_final_outputs_is_a_pure_function_of_the_config():
    config = resolved_config()
    before = repr(config)
    assert final_outputs(config) == final_outputs(resolved_config())
    assert repr(config) == before  # nothing filled in or changed


def test_a_study_naming_another_studys_target_is_refused(monkeypatch):
    import repdiag.cifar.outputs

    monkeypatch.setattr(repdiag.cifar.outputs, "final_outputs", lambda config: {"binding": []})
    with pytest.raises(ValueError, match=r"cifar\.outputs names target 'binding'"):
        final_outputs(resolved_config())


def test_the_workflow_asks_final_outputs_alone_what_to_build():
    """No stage file registers outputs of its own; the Snakefile's targets read final_outputs."""
    snakefile = (ROOT / "Snakefile").read_text()
    assert "FINAL_OUTPUTS = final_outputs(config)" in snakefile
    assert "default_outputs(FINAL_OUTPUTS)" in snakefile and "FINAL_OUTPUTS[" in snakefile
    for path in sorted((ROOT / "rules").rglob("*.smk")):
        assert "final_output(" not in path.read_text(), path


def test_stage_files_import_modules_and_read_no_name_another_stage_file_defines():
    """Every .smk shares one namespace: a stage file that imported a name, or read a name defined
    in another stage file, would depend on include order. Shared names live in common.smk."""
    stages = [p for p in sorted((ROOT / "rules").rglob("*.smk")) if p.name != "common.smk"]
    defined = {
        path.name: set(re.findall(r"^([A-Z][A-Z_0-9]*) = ", path.read_text(), re.M))
        for path in stages
    }
    assert defined["zoo.smk"]  # the check reads something
    for path in stages:
        text = path.read_text()
        assert not re.search(r"^from repdiag", text, re.M), path
        for other, names in defined.items():
            if other != path.name:
                used = sorted(n for n in names if re.search(rf"\b{n}\b", text))
                assert not used, f"{path.name} reads {used} from {other}"


def test_the_checks_are_registered_by_the_entry_points_not_by_an_import():
    """``import repdiag`` and the core's load_config register nothing (a bad config would pass
    unchecked if they silently did nothing, so the core refuses); repdiag.load_config, the CLI
    and the Snakefile call ``repdiag.studies.register`` themselves."""
    import subprocess
    import sys

    code = (
        "import repdiag, repdiag.core.config as c\n"
        "from repdiag.core.errors import RepdiagError\n"
        "try:\n"
        "    c.load_config('config/test.yaml')\n"
        "except RepdiagError as err:\n"
        "    print('refused:', err)\n"
        "config = repdiag.load_config('config/test.yaml')\n"
        "import repdiag.core.checks as k\n"
        "print('registered:', ','.join(k.checked_packages()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    refused, registered = done.stdout.splitlines()
    assert refused.startswith("refused: no packages registered for config checks: call ")
    assert registered == "registered: " + ",".join(CHECKED_PACKAGES)
    assert "\nregister()" in (ROOT / "Snakefile").read_text()
