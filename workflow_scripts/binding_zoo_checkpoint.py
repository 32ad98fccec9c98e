"""Rule zoo_checkpoint: a step its run saved (save_at) -> results/zoo/<run>-step<t>/."""

from repdiag.core.runtime import script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.encoders.zoo.checkpoint import copy_saved_step

    out = snakemake.output
    copy_saved_step(snakemake.input.saved, snakemake.params.step, out.model, out.meta, out.curve)
    log.info("step %d of %s -> %s", snakemake.params.step, snakemake.input.saved, out.meta)
