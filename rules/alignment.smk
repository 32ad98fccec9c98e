# The alignment study (CoSAE vs Crosscoder, USAE and SAE-A): one job per synthetic grid cell, one
# job per real-embedding pair, then tables, claims and figures (repdiag.alignment, repdiag.alignment.metrics).
# Modules, not names, are imported: every .smk shares one namespace.
import repdiag.core.gpu
import repdiag.alignment.grid

ALIGNMENT = config["alignment"]
ALIGNMENT_CELLS = list(repdiag.alignment.grid.grid_cells(ALIGNMENT))
ALIGNMENT_REAL = repdiag.alignment.grid.real_pairs(ALIGNMENT)
ALIGNMENT_TUNED = repdiag.alignment.grid.tuning_enabled(ALIGNMENT)
ALIGNMENT_VARIANTS = (
    repdiag.alignment.grid.grid_variants(ALIGNMENT["grid"]) if ALIGNMENT_TUNED else []
)


rule alignment_lr:
    output:
        "results/alignment/lr/{variant}.json",
    log:
        log_file("alignment_lr", "{variant}"),
    benchmark:
        bench_file("alignment_lr", "{variant}")
    wildcard_constraints:
        variant=one_of(ALIGNMENT_VARIANTS, "NO_VARIANTS"),
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=1,
    params:
        tuning=lambda wildcards: repdiag.alignment.grid.tuning_params(
            ALIGNMENT, wildcards.variant
        ),
        device=config["device"],
    script:
        "../workflow_scripts/alignment_lr.py"


rule alignment_lr_table:
    input:
        expand("results/alignment/lr/{variant}.json", variant=ALIGNMENT_VARIANTS),
    output:
        reported("results/tables/alignment_lr.csv", "alignment_lr", "Alignment"),
    log:
        log_file("alignment_lr_table", "alignment"),
    benchmark:
        bench_file("alignment_lr_table", "alignment")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/alignment_lr_table.py"


rule alignment_cell:
    input:
        lr=lambda wildcards: (
            f"results/alignment/lr/{repdiag.alignment.grid.cell_variant(wildcards.cell)}.json"
            if ALIGNMENT_TUNED
            else []
        ),
    output:
        "results/alignment/{cell}.json",
    log:
        log_file("alignment_cell", "{cell}"),
    benchmark:
        bench_file("alignment_cell", "{cell}")
    wildcard_constraints:
        cell=one_of(ALIGNMENT_CELLS, "NO_CELLS"),
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=repdiag.core.gpu.small_job_gpus(config),
    params:
        cell=lambda wildcards: repdiag.alignment.grid.cell_params(
            ALIGNMENT, wildcards.cell
        ),
        device=repdiag.core.gpu.small_job_device(config),
    script:
        "../workflow_scripts/alignment_cell.py"


rule alignment_real:
    input:
        a=lambda wildcards: f"results/embeddings/{ALIGNMENT_REAL[wildcards.pair]['a']}.zarr",
        b=lambda wildcards: f"results/embeddings/{ALIGNMENT_REAL[wildcards.pair]['b']}.zarr",
        dataset="results/datasets/binding.zarr",
    output:
        "results/alignment/real/{pair}.json",
    log:
        log_file("alignment_real", "{pair}"),
    benchmark:
        bench_file("alignment_real", "{pair}")
    wildcard_constraints:
        pair=one_of(ALIGNMENT_REAL, "NO_PAIRS"),
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=repdiag.core.gpu.small_job_gpus(config),
    params:
        real=lambda wildcards: repdiag.alignment.grid.real_params(
            ALIGNMENT, wildcards.pair
        ),
        device=repdiag.core.gpu.small_job_device(config),
    script:
        "../workflow_scripts/alignment_real.py"


rule alignment_tables:
    input:
        cells=expand("results/alignment/{cell}.json", cell=ALIGNMENT_CELLS),
        real=expand("results/alignment/real/{pair}.json", pair=ALIGNMENT_REAL),
    output:
        table=reported("results/tables/alignment.csv", "alignment_table", "Alignment"),
        summary=reported(
            "results/tables/alignment_summary.csv", "alignment_summary", "Alignment"
        ),
        claims=reported(
            "results/tables/alignment_claims.csv", "alignment_claims", "Alignment"
        ),
    log:
        log_file("alignment_tables", "alignment"),
    benchmark:
        bench_file("alignment_tables", "alignment")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/alignment_tables.py"


rule alignment_figures:
    input:
        table="results/tables/alignment.csv",
    output:
        methods_png=reported(
            "results/figures/alignment_methods.png", "alignment_methods", "Alignment"
        ),
        methods_pdf="results/figures/alignment_methods.pdf",
        fraction_png=reported(
            "results/figures/alignment_paired_fraction.png",
            "alignment_paired_fraction",
            "Alignment",
        ),
        fraction_pdf="results/figures/alignment_paired_fraction.pdf",
    log:
        log_file("alignment_figures", "alignment"),
    benchmark:
        bench_file("alignment_figures", "alignment")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/alignment_figures.py"


rule alignment_real_figure:
    input:
        table="results/tables/alignment.csv",
    output:
        png=reported(
            "results/figures/alignment_real.png", "alignment_real", "Alignment"
        ),
        pdf="results/figures/alignment_real.pdf",
    log:
        log_file("alignment_real_figure", "alignment"),
    benchmark:
        bench_file("alignment_real_figure", "alignment")
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/alignment_real_figure.py"
