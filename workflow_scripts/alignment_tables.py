"""Rule alignment_tables: per-model table, seed summary and the paper's claims with evidence."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import atomic_path, read_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.report import claims_table, results_table, summary_table

    cells = [read_json(path) for path in snakemake.input.cells]
    real = [read_json(path) for path in snakemake.input.real]
    table = results_table(cells, real)
    claims = claims_table(table)
    outputs = {
        snakemake.output.table: table,
        snakemake.output.summary: summary_table(table, real),
        snakemake.output.claims: claims,
    }
    for path, frame in outputs.items():
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False, float_format="%.6g")
    for row in claims.itertuples():
        log.info("claim %s [%s]: %s", row.claim_id, row.scope, row.verdict)
exit_job()
