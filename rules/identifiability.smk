# The identifiability study (repdiag.identifiability, repdiag.identifiability.sphere): one job per grid cell
# (generator x sampling x encoder x loss [x constrained ratio] x seed), then tables and figures.
# Modules, not names, are imported: every .smk shares one namespace.
import repdiag.core.gpu
import repdiag.identifiability.study

IDENTIFIABILITY = config["identifiability"]
IDENTIFIABILITY_CELLS = repdiag.identifiability.study.cell_names(IDENTIFIABILITY)


rule identifiability_cell:
    output:
        result="results/identifiability/{cell}.json",
        curve="results/identifiability/{cell}.curve.csv",
    log:
        log_file("identifiability_cell", "{cell}"),
    benchmark:
        bench_file("identifiability_cell", "{cell}")
    wildcard_constraints:
        cell=one_of(IDENTIFIABILITY_CELLS, "NO_CELLS"),
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=repdiag.core.gpu.small_job_gpus(config),
    params:
        cell=lambda wildcards: repdiag.identifiability.study.cell_params(
            IDENTIFIABILITY, wildcards.cell
        ),
        device=repdiag.core.gpu.small_job_device(config),
    script:
        "../workflow_scripts/identifiability_cell.py"


rule identifiability_tables:
    input:
        cells=expand("results/identifiability/{cell}.json", cell=IDENTIFIABILITY_CELLS),
    output:
        table=reported(
            "results/tables/identifiability.csv",
            "identifiability_table",
            "Identifiability",
        ),
        paper=reported(
            "results/tables/identifiability_paper.csv",
            "identifiability_paper",
            "Identifiability",
        ),
    log:
        log_file("identifiability_tables", "identifiability"),
    benchmark:
        bench_file("identifiability_tables", "identifiability")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/identifiability_tables.py"


rule identifiability_figures:
    input:
        table="results/tables/identifiability.csv",
    output:
        r2_png=reported(
            "results/figures/identifiability_r2.png",
            "identifiability_r2",
            "Identifiability",
        ),
        r2_pdf="results/figures/identifiability_r2.pdf",
        ratio_png=reported(
            "results/figures/identifiability_ratio.png",
            "identifiability_ratio",
            "Identifiability",
        ),
        ratio_pdf="results/figures/identifiability_ratio.pdf",
    log:
        log_file("identifiability_figures", "identifiability"),
    benchmark:
        bench_file("identifiability_figures", "identifiability")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/identifiability_figures.py"


# The like-for-like check (repdiag.identifiability.like_for_like): the violated-diversity MLP cells at the
# authors' batch, in their own folder, against the authors' stored runs.
CHECK_SECTION = repdiag.identifiability.study.check_section(IDENTIFIABILITY)
CHECK_CELLS = repdiag.identifiability.study.cell_names(CHECK_SECTION)


rule identifiability_check_cell:
    output:
        result="results/identifiability_check/{cell}.json",
        curve="results/identifiability_check/{cell}.curve.csv",
    log:
        log_file("identifiability_check_cell", "{cell}"),
    benchmark:
        bench_file("identifiability_check_cell", "{cell}")
    wildcard_constraints:
        cell=one_of(CHECK_CELLS, "NO_CELLS"),
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=1,
    params:
        cell=lambda wildcards: repdiag.identifiability.study.cell_params(
            CHECK_SECTION, wildcards.cell
        ),
        device=config["device"],
    script:
        "../workflow_scripts/identifiability_cell.py"


rule identifiability_check_tables:
    input:
        cells=expand("results/identifiability_check/{cell}.json", cell=CHECK_CELLS),
    output:
        seeds=reported(
            "results/tables/identifiability_check.csv",
            "identifiability_check",
            "Identifiability",
        ),
        claims=reported(
            "results/tables/identifiability_check_claims.csv",
            "identifiability_check",
            "Identifiability",
        ),
        summary="results/identifiability_check/summary.md",
    log:
        log_file("identifiability_check_tables", "identifiability"),
    benchmark:
        bench_file("identifiability_check_tables", "identifiability")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/identifiability_check_tables.py"
