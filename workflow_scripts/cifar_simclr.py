"""Train one SimCLR run on CIFAR-10 and probe it: JSON record and loss curve (rule cifar_simclr)."""

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import write_json, write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    with gpu_slot():
        from repdiag.cifar.study import loader_workers, run_simclr_probe

        device = select_device(snakemake.params.device)
        record, curve = run_simclr_probe(
            dict(snakemake.params.run), str(device), workers=loader_workers(snakemake.threads)
        )
    write_text(
        snakemake.output.curve,
        "step,loss,lr\n" + "".join(f"{s},{v:.6f},{lr:.6g}\n" for s, v, lr in curve),
    )
    write_json(snakemake.output.result, record)
exit_job()
