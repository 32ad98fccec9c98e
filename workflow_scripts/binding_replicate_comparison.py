"""Rule replicate_comparison: the replicate's dose series (the main study's analysis over its
runs), set beside the main run's."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.analysis.units import with_units
    from repdiag.binding.dose import dose_correlations
    from repdiag.binding.replicate import compare_realisations, comparison_markdown
    from repdiag.common.tables import read_table, write_csv

    settings = StatsSettings.from_config(snakemake.params.stats)
    replicate = dose_correlations(
        with_units(read_table(snakemake.input.models)), settings.options()
    )
    comparison = compare_realisations(read_table(snakemake.input.main), replicate)
    varies = int((comparison["verdict"] == "varies between runs").sum()) if len(comparison) else 0
    log.info("%d verdicts compared, %d vary between runs", len(comparison), varies)
    write_csv(replicate, snakemake.output.dose_series)
    write_csv(comparison, snakemake.output.table)
    write_text(snakemake.output.markdown, comparison_markdown(comparison))
exit_job()
