"""Rule jacobian_spectra (gpu=1): one model + probe images -> results/jacobians/<model>.zarr and .json."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before timm/open_clip import huggingface_hub

from pathlib import Path

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device

with script_logging(snakemake.log[0], snakemake.threads) as log, gpu_slot():
    from repdiag.binding.jacobian_stage import load_probes, run_stage
    from repdiag.encoders import build_encoder
    from repdiag.encoders.entries import zoo_dir_of
    from repdiag.encoders.jacobian.options import JacobianSettings

    key, params = snakemake.wildcards.model, snakemake.params
    jacobians = JacobianSettings.from_config(params.jacobians)
    device = select_device(params.device)
    log.info("model %s: Jacobian spectra on device %s", key, device)
    zoo_dir = zoo_dir_of(snakemake.input.zoo)
    encoder = build_encoder(key, params.entry, zoo_dir=zoo_dir)
    binding = snakemake.input.get("dataset")
    probes = load_probes(
        jacobians.probes, encoder.preprocess, binding_store=binding or None, seed=jacobians.seed
    )
    run_stage(
        encoder,
        probes,
        jacobians,
        model=key,
        device=device,
        store=snakemake.output.store,
        summary_path=snakemake.output.summary,
        cache_root=Path(snakemake.output.store).parent / ".cache",
        provenance={
            "models": {key: dict(params.entry)},
            "jacobians": dict(params.jacobians),
            "device": params.device,
            "inputs": dict(params.inputs),  # digests of the weights files and folders read
        },
    )
    log.info("wrote %s and %s", snakemake.output.store, snakemake.output.summary)
exit_job()
