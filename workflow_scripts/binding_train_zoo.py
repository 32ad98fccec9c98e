"""Rule train_zoo: train one zoo run and write model.safetensors, meta.json, curve.csv."""

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.encoders.zoo.checkpoint import save_push, save_saved_steps, save_zoo_run
    from repdiag.encoders.zoo.train import train

    spec, device = snakemake.params.spec, snakemake.params.device
    log.info("zoo run %s: %s on %s, %d steps x %d scenes", spec["run"], spec["objective"],
             spec["timm_model"], spec["steps"], spec["batch_size"])  # fmt: skip
    if device == "cpu":
        result = train(spec, "cpu")
    else:
        with gpu_slot():
            result = train(spec, select_device(device))
    result.meta["threads"] = snakemake.threads
    if result.push is not None:  # a regularised run (rule train_zoo_pushed); meta.json last
        save_push(result.push, snakemake.output.push)
    if result.saved:  # the steps of its save_at (rule train_zoo_saving), named in meta.json
        result.meta["saved_sha256"] = save_saved_steps(result.saved, snakemake.output.saved)
    save_zoo_run(
        result.backbone,
        result.head,
        result.meta,
        result.losses,
        snakemake.output.model,
        snakemake.output.meta,
        snakemake.output.curve,
    )
exit_job()
