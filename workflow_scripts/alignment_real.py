"""Rule alignment_real: every alignment variant on two encoders' embeddings, paired by image id."""

from repdiag.core.runtime import script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.study import run_real
    from repdiag.core.gpu import gpu_slot
    from repdiag.core.runtime import select_device
    from repdiag.core.store import write_json

    params = snakemake.params.real
    log.info("alignment on real embeddings: %s", params["pair"])
    with gpu_slot():
        result = run_real(
            params,
            snakemake.input.a,
            snakemake.input.b,
            select_device(snakemake.params.device),
            dataset=snakemake.input.dataset,
        )
    log.info("pair done in %.1f s", result["wall_time_s"])
    write_json(snakemake.output[0], result)
