"""Rule alignment_real_figure: every variant's metrics on each real-embedding pair."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.alignment.figures import real_figure

    table = pd.read_csv(snakemake.input.table, keep_default_na=True)
    real_figure(table, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s", snakemake.output.png)
exit_job()
