"""Rule alignment_lr: train one variant at every tuning learning rate, pick one on validation."""

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import write_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.tuning import tune_learning_rate

    params = snakemake.params.tuning
    log.info("learning-rate selection for %s over %s", params["variant"], params["tuning"]["lrs"])
    with gpu_slot():
        result = tune_learning_rate(params, select_device(snakemake.params.device))
    log.info(
        "%s: picked lr %g (config %g)", result["variant"], result["picked_lr"], result["default_lr"]
    )
    write_json(snakemake.output[0], result)
exit_job()
