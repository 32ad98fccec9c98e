"""Rule alignment_lr_table: every variant's validation objective at every tuning learning rate."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import atomic_path, read_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.tuning import lr_table

    table = lr_table([read_json(path) for path in snakemake.input])
    with atomic_path(snakemake.output[0]) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    for row in table[table["picked"]].itertuples():
        log.info("%s: lr %g", row.variant, row.lr)
exit_job()
