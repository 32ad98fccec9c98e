"""Rule plot_readouts: binding accuracy per model for cosine, kNN and local PCA, chance line."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.plots import readout_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    models = read_table(snakemake.input.models)
    chance = float(models["chance"].median()) if "chance" in models else None
    save_figure(readout_figure(models, chance=chance), snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s (%d models)", *snakemake.output, models["model"].nunique())
exit_job()
