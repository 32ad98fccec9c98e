"""Rule causal_effects: the arms of each causal base per seed -> results/binding_causal/."""

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.causal import (
    arm_table,
    causal_contrasts,
    full_spectrum_jer,
    run_record,
    screen_losses,
)
from repdiag.binding.causal_report import causal_markdown
from repdiag.binding.stats_options import StatsSettings
from repdiag.common.tables import read_table, write_csv
from repdiag.core.runtime import script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    settings = StatsSettings.from_config(snakemake.params.stats)
    models = snakemake.params.models
    metrics = dict(zip(models, snakemake.input.metrics, strict=True))
    jacobians = dict(zip(models, snakemake.input.jacobians, strict=True))
    zoo_meta = dict(zip(models, snakemake.input.zoo_meta, strict=True))
    table = aggregate(models, metrics, jacobians, settings, zoo_meta).models
    final = table.set_index("model")["final_layer"].astype(str)
    extras = {
        key: run_record(zoo_meta[key])
        | full_spectrum_jer(jacobians[key], final[key], settings.probe_set)
        for key in models
    }
    arms = arm_table(snakemake.params.cells, table, extras, settings.binding_column)
    arms = screen_losses(arms, snakemake.params.loss_spread_sd)
    contrasts = causal_contrasts(arms, settings.confidence)
    calibration = read_table(snakemake.input.calibration)
    log.info("%d runs, %d left out by the loss screen", len(arms), int(arms["left_out"].sum()))
    write_csv(arms, snakemake.output.arms)
    write_csv(contrasts, snakemake.output.contrasts)
    write_csv(table, snakemake.output.models)
    summary = causal_markdown(
        arms,
        contrasts,
        calibration,
        spread_sd=snakemake.params.loss_spread_sd,
        readout=settings.readout,
    )
    write_text(snakemake.output.summary, summary)
