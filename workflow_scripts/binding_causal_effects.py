"""Rule causal_effects: the arms of each causal base per seed -> results/binding_causal/."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.causal.effects import CausalFiles, causal_effects
    from repdiag.common.tables import write_csv

    models = snakemake.params.models
    files = CausalFiles(
        metrics=dict(zip(models, snakemake.input.metrics, strict=True)),
        jacobians=dict(zip(models, snakemake.input.jacobians, strict=True)),
        zoo_meta=dict(zip(models, snakemake.input.zoo_meta, strict=True)),
        weights=dict(zip(models, snakemake.input.weights, strict=True)),
        pushes=dict(zip(snakemake.params.pushed, snakemake.input.pushes, strict=True)),
        calibration=snakemake.input.calibration,
    )
    settings = StatsSettings.from_config(snakemake.params.stats)
    result = causal_effects(models, files, snakemake.params.cells, settings)
    log.info("%d runs, every one kept (intention to treat)", len(result.arms))
    write_csv(result.arms, snakemake.output.arms)
    write_csv(result.contrasts, snakemake.output.contrasts)
    write_csv(result.displacement, snakemake.output.displacement)
    write_csv(result.per_jer, snakemake.output.per_jer)
    write_csv(result.associations, snakemake.output.associations)
    write_csv(result.models, snakemake.output.models)
    write_text(snakemake.output.summary, result.summary)
exit_job()
