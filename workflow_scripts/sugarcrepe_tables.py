"""Rule sugarcrepe_tables: per-model SugarCrepe JSON + Jacobian stores -> accuracy and partial tables."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.depth import headline_jer
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.common.tables import write_csv
    from repdiag.sugarcrepe.report import partial_correlations, read_result, sugarcrepe_table

    settings = StatsSettings.from_config(snakemake.params.stats)
    families = snakemake.params.models
    results = [read_result(path) for path in snakemake.input.results]
    jer = {
        model: headline_jer(path, model, families[model], settings)
        for model, path in zip(families, snakemake.input.jacobians, strict=True)
    }
    log.info("SugarCrepe over %d models; %s: %s", len(results), settings.jer_column, jer)
    table = sugarcrepe_table(results, jer, snakemake.params.zero_shot)
    write_csv(table, snakemake.output.table)
    write_csv(partial_correlations(table, **settings.options()), snakemake.output.partial)
exit_job()
