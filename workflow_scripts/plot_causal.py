"""Rule plot_causal: the JER intervention's manipulation check, effect on binding, and scatter."""

from repdiag.binding.causal import causal_figure
from repdiag.common.figures import save_figure
from repdiag.common.tables import read_table
from repdiag.core.runtime import script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    effects = read_table(snakemake.input.effects)
    models = read_table(snakemake.input.models)
    chance = float(models["chance"].median()) if "chance" in models else None
    figure = causal_figure(
        effects,
        models,
        snakemake.params.comparisons,
        binding_column=f"binding_{snakemake.params.readout}",
        chance=chance,
    )
    save_figure(figure, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s", *snakemake.output)
