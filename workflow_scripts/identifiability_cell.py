"""Train and evaluate one identifiability cell: JSON metrics and the loss curve (rule identifiability_cell)."""

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import write_json, write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    with gpu_slot(device=snakemake.params.device):
        from repdiag.identifiability.study import run_cell

        device = select_device(snakemake.params.device)
        record, curve = run_cell(dict(snakemake.params.cell), str(device))
    write_text(snakemake.output.curve, "step,loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in curve))
    write_json(snakemake.output.result, record)
exit_job()
