"""Aggregate the identifiability cells over seeds and compare with the paper (rule identifiability_tables)."""

from repdiag.core.runtime import script_logging
from repdiag.core.store import read_json
from repdiag.identifiability.report import aggregate, paper_comparison, results_frame, write_csv

with script_logging(snakemake.log[0], snakemake.threads) as log:
    frame = results_frame(read_json(path) for path in snakemake.input.cells)
    write_csv(aggregate(frame), snakemake.output.table)
    write_csv(paper_comparison(frame), snakemake.output.paper)
    log.info("aggregated %d identifiability cells", len(frame))
