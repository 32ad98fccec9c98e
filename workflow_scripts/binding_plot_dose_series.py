"""Rule plot_dose_series: binding against the dose, JER against binding, trajectories by step."""

from repdiag.core.runtime import script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.dose import dose_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    models = read_table(snakemake.input.models)
    chance = float(models["chance"].median()) if "chance" in models else None
    figure = dose_figure(
        models, binding_column=f"binding_{snakemake.params.readout}", chance=chance
    )
    save_figure(figure, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s", *snakemake.output)
