"""Rule alignment_figures: metrics per method and metrics against the paired fraction."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.alignment.figures import methods_figure, paired_fraction_figure

    table = pd.read_csv(snakemake.input.table, keep_default_na=True)
    out = snakemake.output
    methods_figure(table, out.methods_png, out.methods_pdf)
    paired_fraction_figure(table, out.fraction_png, out.fraction_pdf)
    log.info("wrote %s and %s", out.methods_png, out.fraction_png)
exit_job()
