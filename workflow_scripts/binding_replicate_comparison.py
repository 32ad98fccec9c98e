"""Rule replicate_comparison: the dose series of the main run and of its replicate, side by side."""

from repdiag.core.runtime import script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.replicate import compare_realisations, comparison_markdown
    from repdiag.common.tables import read_table, write_csv

    comparison = compare_realisations(
        read_table(snakemake.input.main), read_table(snakemake.input.replicate)
    )
    varies = int((comparison["verdict"] == "varies between runs").sum()) if len(comparison) else 0
    log.info("%d verdicts compared, %d vary between runs", len(comparison), varies)
    write_csv(comparison, snakemake.output.table)
    write_text(snakemake.output.markdown, comparison_markdown(comparison))
