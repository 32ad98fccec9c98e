"""Only stale nodes rerun: each rule depends on exactly the config values it uses.

Each test copies the completed test run (outputs, logs and Snakemake's metadata, with times
preserved), changes one thing, and reads the dry run's job list.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import yaml

from tests.conftest import edit_config, snakemake

RULE_LINE = re.compile(r"^(?:local)?rule (\w+):\s*$")
WILDCARDS_LINE = re.compile(r"^\s+wildcards: (.*)$")

# Rules that read every model's results (aggregates), and rules of the independent branches.
PER_MODEL_RULES = {"extract_embeddings", "jacobian_spectra", "compute_metrics"}


def planned_jobs(workdir: Path, *args: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, wildcards) of every job the dry run would execute, `all` excluded."""
    proc = snakemake(workdir, "-n", *args)
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        rule = RULE_LINE.match(line)
        if rule:
            jobs.append((rule.group(1), {}))
            continue
        wildcards = WILDCARDS_LINE.match(line)
        if wildcards and jobs:
            jobs[-1][1].update(
                dict(item.split("=", 1) for item in wildcards.group(1).split(", ") if "=" in item)
            )
    return [job for job in jobs if job[0] != "all"]


def test_second_run_has_nothing_to_do(completed: Path) -> None:
    assert planned_jobs(completed) == []
    proc = snakemake(completed)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_changing_one_model_reruns_only_its_branch_and_the_aggregates(completed: Path) -> None:
    config = yaml.safe_load((completed / "config" / "test.yaml").read_text())
    model = "mae"
    assert config["models"][model].get("pooling", "cls") == "cls"
    edit_config(completed, lambda c: c["models"][model].update(pooling="mean"))
    jobs = planned_jobs(completed)
    per_model = [(rule, wc["model"]) for rule, wc in jobs if "model" in wc]
    assert per_model, jobs
    assert {m for _, m in per_model} == {model}, per_model
    assert {rule for rule, _ in per_model} == PER_MODEL_RULES
    rules = Counter(rule for rule, _ in jobs)
    assert "render_binding" not in rules and "train_zoo" not in rules
    assert not any(rule.startswith(("identifiability", "alignment_train")) for rule in rules), rules


def test_changing_a_dataset_parameter_reruns_everything_downstream_of_it(completed: Path) -> None:
    edit_config(
        completed,
        lambda c: c["datasets"]["binding"].update(seed=c["datasets"]["binding"].get("seed", 0) + 1),
    )
    jobs = planned_jobs(completed)
    rules = Counter(rule for rule, _ in jobs)
    n_models = len(yaml.safe_load((completed / "config" / "test.yaml").read_text())["models"])
    assert rules["render_binding"] == 1
    for rule in PER_MODEL_RULES:
        assert rules[rule] == n_models, (rule, rules)
    assert "train_zoo" not in rules  # pretraining scenes do not come from the benchmark
    assert not any(rule.startswith("identifiability") for rule in rules), rules


def test_editing_one_script_reruns_only_its_rule_and_descendants(completed: Path) -> None:
    script = completed / "workflow_scripts" / "compute_metrics.py"
    script.write_text(script.read_text() + "\n# edited\n")
    jobs = planned_jobs(completed)
    rules = Counter(rule for rule, _ in jobs)
    n_models = len(yaml.safe_load((completed / "config" / "test.yaml").read_text())["models"])
    assert rules["compute_metrics"] == n_models
    upstream = {"render_binding", "train_zoo", "extract_embeddings", "jacobian_spectra"}
    assert not upstream & set(rules), rules
    assert not any(rule.startswith(("identifiability", "alignment")) for rule in rules), rules


def test_changing_a_covariate_reruns_only_the_statistics(completed: Path) -> None:
    edit_config(
        completed, lambda c: c["models"]["mae"].update(covariates={"zero_shot_accuracy": 0.5})
    )
    rules = Counter(rule for rule, _ in planned_jobs(completed))
    assert rules, "a covariate feeds the aggregate table"
    assert not PER_MODEL_RULES & set(rules), rules
    assert "aggregate_models" in rules
