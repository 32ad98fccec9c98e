"""Rule plot_causal: binding per arm, the primary estimate against the sham, the manipulation
check."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.causal.report import causal_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    arms = read_table(snakemake.input.arms)
    contrasts = read_table(snakemake.input.contrasts)
    models = read_table(snakemake.input.models)
    chance = float(models["binding_chance"].median()) if "binding_chance" in models else None
    settings = StatsSettings.from_config(
        {"readout": snakemake.params.readout, "binding_score": snakemake.params.binding_score}
    )
    figure = causal_figure(arms, contrasts, chance=chance, label=settings.binding_label)
    save_figure(figure, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s", *snakemake.output)
exit_job()
