# Helpers shared by the stage files. Functions only: rules live in the stage files.
import re

from repdiag.binding.causal_options import causal_models
from repdiag.core.config import (
    check_before_run,
    check_config,
    fill_defaults,
    section,
    seeded,
)
from repdiag.core.gpu import count_visible_gpus
from repdiag.core.runtime import check_output_folders, expose_package
from repdiag.core.slurm import patch_slurm_status

# Jobs in conda environments (--sw-deployment-method conda) import repdiag from here.
expose_package(workflow.basedir)
# With --workflow-profile profiles/slurm: report jobs killed by scancel as failed.
patch_slurm_status()

# GPU rules ask for gpu=1. Without --resources gpu=N, cap concurrent GPU jobs at the number of
# visible devices (repdiag.core.gpu.gpu_slot gives each its own); with none, they run on CPU.
if "gpu" not in workflow.global_resources and count_visible_gpus():
    workflow.register_resource("gpu", count_visible_gpus())

fill_defaults(config)
check_config(config)
# results/ and logs/ must not lead outside the working directory (a symlink would make jobs write
# elsewhere without a word).
check_output_folders(".")


onstart:
    # Weights files, hub folders and library caches are read by the jobs, not by Snakemake, and
    # architectures need torch: check those of the models with jobs to run (a zoo model counts
    # when its run trains) before the first job starts (repdiag.core.config.check_before_run, as
    # `repdiag validate` does). Not in check_config, so that a dry run stays fast and plans a
    # config whose weights live on another machine (config/paper.yaml).
    WILDCARDS = [
        getattr(job, "wildcards_dict", {}) for job in workflow.dag.needrun_jobs()
    ]
    RUNS_WITH_JOBS = {wildcards.get("objective") for wildcards in WILDCARDS}
    MODELS_WITH_JOBS = {wildcards.get("model") for wildcards in WILDCARDS} | {
        key
        for key, entry in MODELS.items()
        if entry.get("source") == "zoo" and entry.get("id") in RUNS_WITH_JOBS
    }
    MODELS_WITH_JOBS -= {None}
    if MODELS_WITH_JOBS:
        check_before_run(config, MODELS_WITH_JOBS)


# Each stage file adds the final outputs it contributes to its study (`snakemake binding`, ...)
# and so to `rule all`.
STUDIES = (
    "binding",
    "binding_causal",
    "identifiability",
    "identifiability_check",
    "alignment",
    "cifar",
    "sugarcrepe",
)
STUDY_TARGETS = {study: [] for study in STUDIES}
ALL_TARGETS = []
# Jobs of the main study run first when jobs compete for cores, so its figures and
# results/summary.md arrive before the other studies finish.
BINDING_PRIORITY = 10

MODELS = config.get("models", {})
# The JER intervention's regularised models are built by `snakemake binding_causal` only
# (rules/causal.smk); every other model belongs to the main study.
BINDING_MODELS = {
    key: entry for key, entry in MODELS.items() if key not in causal_models(config)
}


def one_of(names, none):
    """Wildcard constraint matching exactly ``names`` (``none``, a name no job has, if empty)."""
    return "|".join(re.escape(str(name)) for name in names) or none


wildcard_constraints:
    model=one_of(MODELS, "NO_MODELS"),


# Studies built only when named (`snakemake binding_causal`): interventions and checks on top of
# a study, not part of `rule all` (the three papers' studies).
ON_REQUEST = ("binding_causal", "identifiability_check")


def add_targets(study, paths):
    """Final outputs of ``study``: built by `rule <study>`, and by `rule all` unless the study is
    built on request only (ON_REQUEST)."""
    STUDY_TARGETS[study].extend(paths)
    if study not in ON_REQUEST:
        ALL_TARGETS.extend(paths)


def add_rule_targets(study, *rule_proxies):
    """Every output of each rule (``rules.<name>``, no wildcards) as final outputs of ``study``."""
    paths = [str(path) for proxy in rule_proxies for path in proxy.output]
    if any("{" in path for path in paths):
        raise ValueError(f"add_rule_targets: outputs with wildcards in {paths}")
    add_targets(study, paths)


def log_file(rule_name, stem="{model}"):
    """Log path of a job: outside results/, never among the outputs."""
    return f"logs/{rule_name}/{stem}.log"


def bench_file(rule_name, stem="{model}"):
    return f"logs/benchmarks/{rule_name}/{stem}.tsv"


def model_entry(wildcards):
    """The config entry of one model: exactly what that model's jobs depend on."""
    return MODELS[wildcards.model]


def encoder_entry(wildcards):
    """A model's entry without `covariates`: what building the encoder depends on.

    Covariates (e.g. published zero-shot accuracy) only feed the statistics, so changing one
    must not rerun extraction or Jacobian spectra.
    """
    entry = MODELS[wildcards.model]
    return {key: value for key, value in entry.items() if key != "covariates"}
