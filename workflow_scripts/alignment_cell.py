"""Rule alignment_cell: train one synthetic grid cell and write its metrics JSON."""

import resource

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import read_json, write_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.alignment.study import run_cell

    params = snakemake.params.cell
    log.info("alignment cell %s", params["cell"]["name"])
    lr = read_json(snakemake.input.lr)["picked_lr"] if snakemake.input.get("lr") else None
    if lr is not None:
        log.info("learning rate %g, picked on the validation split (%s)", lr, snakemake.input.lr)
    with gpu_slot(device=snakemake.params.device):
        result = run_cell(params, select_device(snakemake.params.device), lr=lr)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    log.info(
        "cell done: %.1f s wall, %.1f s CPU in the cell, %.1f s CPU in the process (imports included)",
        result["wall_time_s"],
        result["cpu_time_s"],
        usage.ru_utime + usage.ru_stime,
    )
    write_json(snakemake.output[0], result)
exit_job()
