"""Only stale nodes rerun: each rule depends on exactly the config values it uses.

Each test copies the completed test run (outputs, logs and Snakemake's metadata, with times
preserved), changes one thing, and asks Snakemake's DAG in process which jobs it would run
(tests.planning.plan).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import edit_config, is_recomputed, remove_recomputed, snakemake
from tests.planning import plan, rule_counts

# Rules that run once per model, and the upstream and independent branches the tests name.
PER_MODEL_RULES = {"extract_embeddings", "jacobian_spectra", "compute_metrics"}
UPSTREAM_RULES = {"render_binding", "train_zoo", "extract_embeddings", "jacobian_spectra"}
IDENTIFIABILITY_RULES = {
    "identifiability_cell",
    "identifiability_tables",
    "identifiability_figures",
}
ALIGNMENT_RULES = {"alignment_cell", "alignment_lr", "alignment_real", "alignment_tables"}
NAMED_RULES = PER_MODEL_RULES | UPSTREAM_RULES | IDENTIFIABILITY_RULES | ALIGNMENT_RULES
NAMED_RULES |= {"aggregate_models"}


def _models(workdir: Path) -> list[str]:
    return list(yaml.safe_load((workdir / "config" / "test.yaml").read_text())["models"])


def test_every_rule_the_checks_name_exists(completed: Path) -> None:
    """A set of rule names that no rule has makes its check vacuous (it once held
    "alignment_train", which matched nothing)."""
    rules: set[str] = set()
    assert plan(completed, rules=rules) == []
    assert NAMED_RULES <= rules, sorted(NAMED_RULES - rules)


def test_second_run_has_nothing_to_do(completed: Path) -> None:
    proc = snakemake(completed)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_the_shared_second_run_recomputes_exactly_what_it_removes(
    workflow_run: Path, tmp_path: Path
) -> None:
    """tests.conftest.rerun_downstream removes metrics, real-pair alignment, tables, figures and
    summaries: exactly the jobs that write them rerun, nothing upstream of them."""
    workdir = shutil.copytree(workflow_run, tmp_path / "run", symlinks=True)
    every_job = plan(workdir, forceall=True)
    expected = {job.key for job in every_job if all(map(is_recomputed, job.outputs))}
    remove_recomputed(workdir)
    planned = plan(workdir)
    assert {job.key for job in planned} == expected
    counts = rule_counts(planned)
    assert counts["compute_metrics"] == len(_models(workdir))
    assert not UPSTREAM_RULES & set(counts), counts
    assert not {"identifiability_cell", "alignment_cell", "alignment_lr"} & set(counts), counts


def test_changing_one_model_reruns_only_its_branch_and_the_aggregates(completed: Path) -> None:
    config = yaml.safe_load((completed / "config" / "test.yaml").read_text())
    model = "mae"
    assert config["models"][model].get("pooling", "cls") == "cls"
    edit_config(completed, lambda c: c["models"][model].update(pooling="mean"))
    jobs = plan(completed)
    per_model = [(job.rule, job.wildcards["model"]) for job in jobs if "model" in job.wildcards]
    assert per_model, jobs
    assert {m for _, m in per_model} == {model}, per_model
    assert {rule for rule, _ in per_model} == PER_MODEL_RULES
    rules = set(rule_counts(jobs))
    assert not {"render_binding", "train_zoo"} & rules, rules
    assert not (IDENTIFIABILITY_RULES | ALIGNMENT_RULES) & rules, rules


def test_changing_a_dataset_parameter_reruns_everything_downstream_of_it(completed: Path) -> None:
    edit_config(
        completed,
        lambda c: c["datasets"]["binding"].update(seed=c["datasets"]["binding"].get("seed", 0) + 1),
    )
    rules = rule_counts(plan(completed))
    assert rules["render_binding"] == 1
    for rule in PER_MODEL_RULES:
        assert rules[rule] == len(_models(completed)), (rule, rules)
    assert "train_zoo" not in rules  # pretraining scenes do not come from the benchmark
    assert not IDENTIFIABILITY_RULES & set(rules), rules


def test_editing_one_script_reruns_only_its_rule_and_descendants(completed: Path) -> None:
    script = completed / "workflow_scripts" / "binding_compute_metrics.py"
    script.write_text(script.read_text() + "\n# edited\n")
    rules = rule_counts(plan(completed))
    assert rules["compute_metrics"] == len(_models(completed))
    assert not UPSTREAM_RULES & set(rules), rules
    assert not (IDENTIFIABILITY_RULES | ALIGNMENT_RULES) & set(rules), rules


@pytest.mark.parametrize("covariate", [{"zero_shot_accuracy": 0.5}])
def test_changing_a_covariate_reruns_only_the_statistics(completed: Path, covariate) -> None:
    edit_config(completed, lambda c: c["models"]["mae"].update(covariates=covariate))
    rules = rule_counts(plan(completed))
    assert rules, "a covariate feeds the aggregate table"
    assert not PER_MODEL_RULES & set(rules), rules
    assert "aggregate_models" in rules
