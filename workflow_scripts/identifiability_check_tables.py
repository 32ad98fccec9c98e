"""Rule identifiability_check_tables: our violated-diversity MLP seeds beside the authors' runs."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import read_json, write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.common.tables import write_csv
    from repdiag.identifiability.like_for_like import (
        authors_runs,
        check_markdown,
        distribution_claims,
        seed_table,
    )
    from repdiag.identifiability.report import results_frame

    frame = results_frame(read_json(path) for path in snakemake.input.cells)
    authors = authors_runs()
    seeds, claims = seed_table(frame, authors), distribution_claims(frame, authors)
    write_csv(seeds, snakemake.output.seeds, float_format="%.6g")
    write_csv(claims, snakemake.output.claims, float_format="%.6g")
    write_text(snakemake.output.summary, check_markdown(seeds, claims))
    log.info(
        "like-for-like check: %d cells, distributions agree for %d of %d generators",
        len(frame),
        int((claims["agree"] == True).sum()),  # noqa: E712 (None: no authors' runs)
        len(claims),
    )
exit_job()
