# Helpers and names shared by the stage files; rules live in the stage files. Every .smk shares
# one namespace, so a stage file imports modules, not names, and reads no name another stage
# file defines: what several need is defined here.
import re

from repdiag.binding.outputs import binding_models
from repdiag.core.checks import check_before_run
from repdiag.core.config import check_config, fill_defaults, section, seeded
from repdiag.core.config_files import check_repeated_entries, merged_config_files
from repdiag.core.digests import digests
from repdiag.core.gpu import count_visible_gpus
from repdiag.core.offline import enforce_offline
from repdiag.core.runtime import check_output_folders, expose_package
from repdiag.core.slurm import patch_slurm_status
from repdiag.encoders.entries import cache_dir, model_files
from repdiag.encoders.zoo.spec import zoo_files, zoo_models_of, zoo_runs_of
from repdiag.studies import target

# Jobs in conda environments (--sw-deployment-method conda) import repdiag from here.
expose_package(workflow.basedir)
# With --workflow-profile profiles/slurm: report jobs killed by scancel as failed.
patch_slurm_status()
# Every job runs offline: HF_HUB_OFFLINE=1 and the like, over any value the user's environment
# gives (jobs inherit this process's environment; a cluster job parses this file again).
enforce_offline()

# GPU rules ask for gpu=1. Without --resources gpu=N, cap concurrent GPU jobs at the number of
# visible devices (repdiag.core.gpu.gpu_slot gives each its own); with none, they run on CPU.
if "gpu" not in workflow.global_resources and count_visible_gpus():
    workflow.register_resource("gpu", count_visible_gpus())

# Two config files defining one model (zoo backbone, zoo run) would be merged key by key: the
# --configfile files, and config/config.yaml with them where a profile does not replace it. A
# job of a cluster executor rereads the files without the profile's replace flag (Snakemake's
# job command line): the main process, which planned it, has checked what it merged.
check_repeated_entries(
    merged_config_files(
        workflow.configfiles,
        workflow.overwrite_configfiles or [],
        workflow.config_settings.replace_workflow_config
        or not workflow.is_main_process,
    )
)
fill_defaults(config)
check_config(config)
# results/ and logs/ must not lead outside the working directory (a symlink would make jobs write
# elsewhere without a word).
check_output_folders(".")


onstart:
    # Weights files, hub folders and library caches are read by the jobs, not by Snakemake, and
    # architectures need torch: check those of the models with jobs to run (a zoo model counts
    # when its run trains) before the first job starts (repdiag.core.checks.check_before_run, as
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
        # a model whose build checks passed under the same config, code and libraries is not
        # built again (repdiag.core.checks.build_check_key): that build imports torch and timm
        check_before_run(
            config, MODELS_WITH_JOBS, passed=cache_dir() / "build-checks"
        )


def priority_of(study):
    """Snakemake priority of the jobs of ``study``'s stages (repdiag.studies.TARGETS: the main
    study's run first when jobs compete for cores, so its figures and results/summary.md arrive
    before the other studies finish)."""
    return target(study).priority


MODELS = config.get("models", {})
# The JER intervention's regularised models are built by `snakemake binding_causal` only
# (rules/binding/causal.smk), the family comparison's runs by `snakemake binding_families` only
# (rules/binding/families.smk); every other model belongs to the main study.
BINDING_MODELS = binding_models(config)
# the main study's models trained by the workflow (rules/binding/zoo.smk), and their runs
BINDING_ZOO_MODELS = zoo_models_of(BINDING_MODELS)
BINDING_ZOO_RUNS = zoo_runs_of(BINDING_MODELS)


def one_of(names, none):
    """Wildcard constraint matching exactly ``names`` (``none``, a name no job has, if empty)."""
    return "|".join(re.escape(str(name)) for name in names) or none


wildcard_constraints:
    model=one_of(MODELS, "NO_MODELS"),


def log_file(rule_name, stem="{model}"):
    """Log path of a job: outside results/, never among the outputs."""
    return f"logs/{rule_name}/{stem}.log"


def bench_file(rule_name, stem="{model}"):
    return f"logs/benchmarks/{rule_name}/{stem}.tsv"


def reported(path, caption, category, subcategory=None):
    """``path`` flagged for `snakemake --report`, captioned by report/<caption>.rst. The caption is
    absolute: Snakemake resolves a relative one against the file that defines the rule.
    """
    return report(
        path,
        caption=f"{workflow.basedir}/report/{caption}.rst",
        category=category,
        subcategory=subcategory,
    )


def model_entry(wildcards):
    """The config entry of one model: exactly what that model's jobs depend on."""
    return MODELS[wildcards.model]


# Files a job reads that are not Snakemake inputs (weights files, image folders) enter its params
# as digests (repdiag.core.digests: a file's SHA-256, a folder's manifest of names, sizes and
# mtimes), so a change reruns exactly the jobs that read them; SHA-256s are cached here between
# Snakemake calls by path, size and mtime.
DIGEST_CACHE = ".snakemake/repdiag/digests.json"


def folder_digests(*named):
    """``{dotted key: digest}`` of each ``(dotted key, folder)`` whose folder is set: its
    manifest, or its files' content under ``folder_digest: content``."""
    kind = "dir-content" if config["folder_digest"] == "content" else "dir"
    return digests([(where, path, kind) for where, path in named if path], DIGEST_CACHE)


def model_digests(wildcards):
    """Digests of the files a model's encoder reads (``pretrained:`` and ``weights:`` files, a hub
    repository; repdiag.encoders.entries.model_files). Zoo checkpoints are inputs instead.
    """
    key = wildcards.model
    return digests(model_files(key, MODELS[key]), DIGEST_CACHE)


def encoder_entry(wildcards):
    """A model's entry without `covariates`: what building the encoder depends on.

    Covariates (e.g. published zero-shot accuracy) only feed the statistics, so changing one
    must not rerun extraction or Jacobian spectra.
    """
    entry = MODELS[wildcards.model]
    return {key: value for key, value in entry.items() if key != "covariates"}
