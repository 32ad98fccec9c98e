"""Rule aggregate_models: one row per model -> results/tables/{models,depth_profiles,spectra}.csv."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.aggregate import aggregate
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.common.tables import write_csv

    models = snakemake.params.models
    settings = StatsSettings.from_config(snakemake.params.stats)
    metrics = dict(zip(models, snakemake.input.metrics, strict=True))
    jacobians = dict(zip(models, snakemake.input.jacobians, strict=True))
    zoo_meta = dict(zip(snakemake.params.zoo_models, snakemake.input.zoo_meta, strict=True))
    result = aggregate(models, metrics, jacobians, settings, zoo_meta)
    log.info("aggregated %d models, %d depth rows", len(result.models), len(result.depth))
    write_csv(result.models, snakemake.output.models)
    write_csv(result.depth, snakemake.output.depth)
    write_csv(result.spectra, snakemake.output.spectra)
exit_job()
