"""profiles/slurm without a cluster: what Snakemake reads from it, and that it fits the rules."""

from __future__ import annotations

import re

import pytest
import yaml
from snakemake.profiles import ProfileConfigFileParser

from tests.conftest import REPO, copy_workflow, snakemake
from tests.slurm.local_slurm import cpu_override_args

PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
DEFAULT_PROFILE = REPO / "profiles" / "default" / "config.yaml"


def profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


def rule_blocks() -> dict[str, str]:
    """Every rule of the workflow -> the text of its definition in rules/*.smk."""
    blocks = {}
    for path in sorted((REPO / "rules").rglob("*.smk")):
        parts = re.split(r"^rule (\w+):\n", path.read_text(), flags=re.MULTILINE)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            blocks[name] = re.split(r"^\S", body, maxsplit=1, flags=re.MULTILINE)[0]
    return blocks


def test_snakemake_reads_the_profile_as_command_line_arguments() -> None:
    with open(PROFILE) as stream:
        args = ProfileConfigFileParser().parse(stream)
    assert args["executor"] == "slurm"
    assert args["replace-workflow-config"] == "True"
    assert args["rerun-incomplete"] == "True"
    assert int(args["jobs"]) >= 1 and int(args["latency-wait"]) >= 5
    assert args["set-resource-scopes"] == ["gpu=local"]
    defaults = dict(item.split("=", 1) for item in args["default-resources"])
    assert set(defaults) >= {"slurm_partition", "runtime", "mem_mb"}
    assert int(defaults["runtime"]) > 0 and int(defaults["mem_mb"]) > 0
    assert "extract_embeddings:gpu=1" in args["set-resources"]


def test_profile_keeps_the_default_profiles_config_semantics() -> None:
    """A SLURM run reads the same config as a local one (else params differ and jobs rerun)."""
    default = yaml.safe_load(DEFAULT_PROFILE.read_text())
    for key in ("replace-workflow-config", "rerun-incomplete"):
        assert profile()[key] == default[key], key


def test_set_resources_name_rules_of_the_workflow() -> None:
    unknown = set(profile()["set-resources"]) - set(rule_blocks())
    assert not unknown, f"profiles/slurm names rules that do not exist: {sorted(unknown)}"


def test_every_gpu_rule_asks_slurm_for_a_gpu_with_limits() -> None:
    gpu_rules = {name for name, body in rule_blocks().items() if re.search(r"\bgpu=1,", body)}
    assert {"extract_embeddings", "jacobian_spectra", "identifiability_check_cell"} <= gpu_rules
    resources = profile()["set-resources"]
    for rule in gpu_rules:
        assert resources.get(rule, {}).get("gpu") == 1, f"{rule} needs gpu: 1 in profiles/slurm"
        assert resources[rule]["mem_mb"] > 0, rule
        if rule == "jacobian_spectra":  # per model, from the rule (repdiag.core.slurm)
            assert "runtime" not in resources[rule]
            assert "jacobian_runtime(" in rule_blocks()[rule]
        else:
            assert resources[rule]["runtime"] > 0, rule
    # train_zoo takes a GPU only when zoo.device asks for one: the rule decides, not the profile
    assert "gpu" not in resources["train_zoo"]
    assert "gpu=0 if" in rule_blocks()["train_zoo"]


def test_small_jobs_run_on_cpu_cores_and_long_jobs_are_retried() -> None:
    """The small cells hold no GPU by default (the rule asks small_job_gpus: 0 for cpu) and the
    profile does not force one; failed jobs are resubmitted (the Jacobian chunk cache resumes)."""
    from repdiag.core.config import fill_defaults
    from repdiag.core.gpu import small_job_device, small_job_gpus

    resources = profile()["set-resources"]
    for rule in ("identifiability_cell", "alignment_cell", "alignment_real"):
        assert "small_job_gpus(config)" in rule_blocks()[rule], rule
        assert "small_job_device(config)" in rule_blocks()[rule], rule
        assert "gpu" not in resources[rule], rule
    defaults = fill_defaults({})
    assert small_job_device(defaults) == "cpu" and small_job_gpus(defaults) == 0
    assert small_job_gpus({"small_jobs_device": "auto"}) == 1
    assert small_job_gpus({"small_jobs_device": "cuda:1"}) == 1
    assert profile()["retries"] >= 1


def test_cpu_override_maps_gpu_rules_to_cpu_and_keeps_the_rest() -> None:
    fake = {
        "set-resources": {
            "a": {"gpu": 1, "gpu_model": "a100", "runtime": 60, "mem_mb": 32000},
            "b": {"runtime": 10, "mem_mb": 100},
        }
    }
    assert cpu_override_args(fake, node_mem_mb=8000) == [
        "--set-resources",
        "a:gpu=0",
        "a:runtime=60",
        "a:mem_mb=8000",
        "b:runtime=10",
        "b:mem_mb=100",
    ]
    assert cpu_override_args({}, 8000) == []


@pytest.mark.workflow
def test_dry_run_with_the_profile_gives_jobs_its_resources(tmp_path) -> None:
    """The real plugin accepts the profile; jobs carry partition, runtime, memory and GPUs."""
    workdir = copy_workflow(tmp_path / "wf")
    out = snakemake(
        workdir,
        "-n",
        "--workflow-profile",
        "profiles/slurm",
        "results/metrics/simclr.json",
    ).stdout
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        match = re.match(r"(?:local)?rule (\w+):", block)
        resources = re.search(r"resources: (.*)", block)
        if match and resources:
            jobs[match.group(1)] = dict(
                item.split("=", 1) for item in resources.group(1).split(", ")
            )
    expected = profile()
    partition = expected["default-resources"]["slurm_partition"]
    assert set(jobs) == {"render_binding", "train_zoo", "extract_embeddings", "compute_metrics"}
    for rule, resources in jobs.items():
        wanted = {**expected["default-resources"], **expected["set-resources"].get(rule, {})}
        assert resources["slurm_partition"] == partition, rule
        assert int(resources["runtime"]) == wanted["runtime"], rule
        if rule in expected["set-resources"]:
            assert int(resources["mem_mb"]) == wanted["mem_mb"], rule
    assert jobs["extract_embeddings"]["gpu"] == "1"
    assert jobs["train_zoo"]["gpu"] == "0"  # config/test.yaml trains the zoo on CPU
