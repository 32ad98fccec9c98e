# repdiag: the workflow. Each study's rules live under its name (rules/binding/*.smk: the main
# study's stages; rules/<study>.smk: the others), shared helpers in rules/common.smk; logic lives
# in the repdiag package.
from snakemake.utils import min_version

from repdiag.core.config import (
    canonical_params,
    check_config_files,
    short_schema_errors,
)
from repdiag.core.validation import validate_config
from repdiag.studies import TARGETS, default_outputs, final_outputs, register

min_version("9.0")
register()  # the packages whose config checks run (repdiag.studies)


configfile: "config/config.yaml"


# Snakemake keeps the last of two equal YAML keys; a model listed twice must be an error instead.
check_config_files(workflow.configfiles)
# A schema error names the key path and the rule broken, not the whole instance.
with short_schema_errors(workflow.configfiles):
    validate_config(config)  # snakemake.utils.validate's semantics, schemas parsed once


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/binding/datasets.smk"
include: "rules/binding/zoo.smk"
include: "rules/binding/embeddings.smk"
include: "rules/binding/jacobians.smk"
include: "rules/binding/metrics.smk"
include: "rules/binding/stats.smk"
include: "rules/binding/causal.smk"
include: "rules/binding/families.smk"
include: "rules/binding/replicate.smk"
include: "rules/identifiability.smk"
include: "rules/cifar.smk"
include: "rules/alignment.smk"
include: "rules/sugarcrepe.smk"


# What each target builds is one pure function of the config (repdiag.studies.final_outputs,
# gathered from each study's outputs module), computed once: `rule all` builds the targets not
# on request.
FINAL_OUTPUTS = final_outputs(config)


rule all:
    default_target: True
    input:
        default_outputs(FINAL_OUTPUTS),


# One rule per target of repdiag.studies.TARGETS, named after it: `snakemake binding` (the main
# study alone), `binding_causal` (the JER intervention), `binding_families` (the objectives at
# the binding budget), `identifiability`,
# `identifiability_check` (against the authors' runs), `alignment`, `cifar` and `sugarcrepe`
# (when enabled). Each builds its entry of FINAL_OUTPUTS. A loop, because the targets
# are data (repdiag.studies.TARGETS) and a rule's name cannot come from a function call.
for study_target in TARGETS:

    rule:
        name:
            study_target.name
        input:
            FINAL_OUTPUTS[study_target.name],


# Params compare by value: a config with its keys in another order reruns nothing. Snakemake has
# no hook for this, so the rules' params are rewritten here, after the last rule (the docstring
# of repdiag.core.config.canonical_params says why and which test holds it).
canonical_params(workflow.rules)
