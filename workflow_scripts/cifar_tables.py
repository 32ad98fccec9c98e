"""Per-run table and the summary table (mean, spread, gaps between architectures) (rule cifar_tables)."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import read_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.cifar.report import runs_table, summary_table
    from repdiag.common.tables import write_csv

    runs = runs_table([read_json(path) for path in snakemake.input.runs])
    summary = summary_table(runs, snakemake.params.architectures, snakemake.params.regimes)
    write_csv(runs, snakemake.output.runs, float_format="%.6g")
    write_csv(summary, snakemake.output.table, float_format="%.6g")
    log.info("%d runs -> %d summary rows", len(runs), len(summary))
exit_job()
