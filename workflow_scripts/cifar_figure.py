"""Probe accuracy by regime and architecture, and the gaps between architectures (rule cifar_figure)."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.cifar.report import plot_cifar

    plot_cifar(
        pd.read_csv(snakemake.input.runs),
        pd.read_csv(snakemake.input.table),
        snakemake.params.architectures,
        snakemake.params.regimes,
        [snakemake.output.png, snakemake.output.pdf],
    )
exit_job()
