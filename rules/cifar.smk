# SimCLR on CIFAR-10 (repdiag.cifar, repdiag.cifar.data): one GPU job per architecture x
# augmentation regime x seed (train + linear probe), then a table and a figure. Off unless
# cifar.enabled; `snakemake cifar` builds just this branch.
from pathlib import Path

import repdiag.cifar.study
import repdiag.cifar.data

CIFAR = config["cifar"]
CIFAR_RUNS = repdiag.cifar.study.run_names(CIFAR)


rule cifar_simclr:
    input:
        data=lambda wildcards: repdiag.cifar.data.data_files(
            CIFAR["data_dir"], CIFAR["format"]
        ),
    output:
        result="results/cifar/{run}.json",
        curve="results/cifar/{run}.curve.csv",
    log:
        log_file("cifar_simclr", "{run}"),
    benchmark:
        bench_file("cifar_simclr", "{run}")
    wildcard_constraints:
        run=one_of(CIFAR_RUNS, "NO_RUNS"),
    conda:
        "../envs/torch.yaml"
    threads: CIFAR["threads"]
    resources:
        gpu=1,
    params:
        run=lambda wildcards: repdiag.cifar.study.run_params(CIFAR, wildcards.run),
        device=config["device"],
        # the train/ and test/ folders of the folder layout, by manifest (batch files are inputs)
        inputs=lambda wildcards: folder_digests(
            *(
                (f"cifar.data_dir/{Path(path).name}", path)
                for path in repdiag.cifar.data.data_files(
                    CIFAR["data_dir"], CIFAR["format"]
                )
                if Path(path).is_dir()
            )
        ),
    script:
        "../workflow_scripts/cifar_simclr.py"


rule cifar_tables:
    input:
        runs=expand("results/cifar/{run}.json", run=CIFAR_RUNS),
    output:
        table=reported(
            "results/tables/cifar_simclr.csv",
            "cifar_table",
            "Identifiability",
            "CIFAR-10",
        ),
        runs=reported(
            "results/tables/cifar_simclr_runs.csv",
            "cifar_runs",
            "Identifiability",
            "CIFAR-10",
        ),
    log:
        log_file("cifar_tables", "cifar"),
    benchmark:
        bench_file("cifar_tables", "cifar")
    conda:
        "../envs/analysis.yaml"
    params:
        architectures=CIFAR["architectures"],
        regimes=CIFAR["regimes"],
    script:
        "../workflow_scripts/cifar_tables.py"


rule cifar_figure:
    input:
        table="results/tables/cifar_simclr.csv",
        runs="results/tables/cifar_simclr_runs.csv",
    output:
        png=reported(
            "results/figures/cifar_simclr.png",
            "cifar_figure",
            "Identifiability",
            "CIFAR-10",
        ),
        pdf="results/figures/cifar_simclr.pdf",
    log:
        log_file("cifar_figure", "cifar"),
    benchmark:
        bench_file("cifar_figure", "cifar")
    conda:
        "../envs/analysis.yaml"
    params:
        architectures=CIFAR["architectures"],
        regimes=CIFAR["regimes"],
    script:
        "../workflow_scripts/cifar_figure.py"
