"""Rule plot_metric_scatter: every metric against the headline binding score, one panel each."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.analysis.statistics import headline_metrics
    from repdiag.binding.plots import scatter_grid
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    models = read_table(snakemake.input.models)
    settings = StatsSettings.from_config(
        {
            "covariates": snakemake.params.covariates,
            "readout": snakemake.params.readout,
            "binding_score": snakemake.params.binding_score,
        }
    )
    chance = float(models["binding_chance"].median()) if "binding_chance" in models else None
    fig = scatter_grid(
        models,
        headline_metrics(models, settings),
        "binding",
        target_label=settings.binding_label,
        chance=chance,
    )
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s (%d models)", *snakemake.output, models["model"].nunique())
exit_job()
