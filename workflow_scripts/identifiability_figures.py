"""R^2 per generator and condition; R^2 against the constrained ratio (rule identifiability_figures)."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.identifiability.report import plot_r2, plot_ratio

    table = pd.read_csv(snakemake.input.table)
    plot_r2(table, [snakemake.output.r2_png, snakemake.output.r2_pdf])
    plot_ratio(table, [snakemake.output.ratio_png, snakemake.output.ratio_pdf])
exit_job()
