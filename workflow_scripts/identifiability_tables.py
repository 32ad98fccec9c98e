"""Aggregate the identifiability cells over seeds and compare with the paper (rule identifiability_tables)."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import read_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.common.tables import write_csv
    from repdiag.identifiability.report import aggregate, paper_comparison, results_frame

    frame = results_frame(read_json(path) for path in snakemake.input.cells)
    write_csv(aggregate(frame), snakemake.output.table, float_format="%.6g")
    write_csv(paper_comparison(frame), snakemake.output.paper, float_format="%.6g")
    log.info("aggregated %d identifiability cells", len(frame))
exit_job()
