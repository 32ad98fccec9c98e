"""Rule alignment_real: every alignment variant on two encoders' embeddings, paired by image id."""

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import write_json

# The binding store's arrays that say which shape sits in which slot (not its images).
ATTRIBUTE_ARRAYS = ["query_shape", "candidate_shape", "pair_shape", "shape_name"]

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.study import run_real
    from repdiag.binding.store import open_binding_store, slot_attributes

    params = snakemake.params.real
    log.info("alignment on real embeddings: %s", params["pair"])
    # the images' known attributes, read here: the alignment study imports no other study
    dataset = open_binding_store(snakemake.input.dataset, variables=ATTRIBUTE_ARRAYS)
    with gpu_slot(device=snakemake.params.device):
        result = run_real(
            params,
            snakemake.input.a,
            snakemake.input.b,
            select_device(snakemake.params.device),
            attributes=slot_attributes(dataset),
        )
    log.info("pair done in %.1f s", result["wall_time_s"])
    write_json(snakemake.output[0], result)
exit_job()
