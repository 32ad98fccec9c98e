"""Rule zoo_checkpoint: a step its run saved (save_at) -> results/zoo/<run>-step<t>/."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.encoders.zoo.checkpoint import copy_saved_step

    step, source = snakemake.params.step, snakemake.input
    copy_saved_step(source.saved, step, source.run_meta, snakemake.output)
    log.info("step %d of %s -> %s", step, source.saved, snakemake.output.meta)
exit_job()
