# Helpers shared by the stage files. Functions only: rules live in the stage files.
import re

from repdiag.config import check_config, fill_defaults, section
from repdiag.runtime import expose_package

# Jobs in conda environments (--sw-deployment-method conda) import repdiag from here.
expose_package(workflow.basedir)

fill_defaults(config)
check_config(config)

# Each stage file appends the final outputs it contributes to `rule all`.
ALL_TARGETS = []

MODELS = config.get("models", {})


wildcard_constraints:
    model="|".join(re.escape(key) for key in MODELS) or "NO_MODELS",


def log_file(rule_name, stem="{model}"):
    """Log path of a job: outside results/, never among the outputs."""
    return f"logs/{rule_name}/{stem}.log"


def bench_file(rule_name, stem="{model}"):
    return f"logs/benchmarks/{rule_name}/{stem}.tsv"


def model_entry(wildcards):
    """The config entry of one model: exactly what that model's jobs depend on."""
    return MODELS[wildcards.model]
