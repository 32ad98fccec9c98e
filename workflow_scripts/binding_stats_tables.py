"""Rule stats_tables: correlations, OLS, partial correlations, families, robustness, paper comparison."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.analysis.statistics import statistics_tables
    from repdiag.common.tables import read_table, write_csv

    settings = StatsSettings.from_config(snakemake.params.stats)
    models = read_table(snakemake.input.models)
    depth = read_table(snakemake.input.depth)
    log.info(
        "statistics over %d models (%d bootstrap resamples)", len(models), settings.n_bootstrap
    )
    tables = statistics_tables(models, depth, settings)
    primary = getattr(snakemake.params, "primary", None)
    if primary:  # the family comparison's own tables (rules/binding/families.smk)
        from repdiag.binding.analysis.primary import family_design_tables

        tables |= family_design_tables(models, settings, primary)
    for name, table in tables.items():
        if isinstance(table, pd.DataFrame):
            write_csv(table, snakemake.output[name])
        else:
            write_text(snakemake.output[name], table)
exit_job()
