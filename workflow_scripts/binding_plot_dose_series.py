"""Rule plot_dose_series: binding against the dose, JER against binding, trajectories by step."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.dose import dose_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    models = read_table(snakemake.input.models)
    settings = StatsSettings.from_config(
        {"readout": snakemake.params.readout, "binding_score": snakemake.params.binding_score}
    )
    chance = float(models["binding_chance"].median()) if "binding_chance" in models else None
    figure = dose_figure(
        models,
        binding_column=settings.binding_column,
        chance=chance,
        label=settings.binding_label,
    )
    save_figure(figure, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s", *snakemake.output)
exit_job()
