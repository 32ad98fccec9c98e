"""Rule extract_embeddings: one model's entry + the binding store -> results/embeddings/<model>.zarr."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before timm/open_clip import huggingface_hub


from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log, gpu_slot():
    from repdiag.binding.store import image_sets, open_binding_store
    from repdiag.encoders.embeddings import extract_model
    from repdiag.encoders.entries import zoo_dir_of

    key, params = snakemake.wildcards.model, snakemake.params
    settings = {
        "batch_size": params.batch_size,
        "image_sets": list(params.image_sets),
        "folder": params.folder,
        "device": params.device,
        "precision": params.precision,
    }
    # the binding store's sets, read here: repdiag.encoders is given images, it imports no study
    binding_sets = image_sets(open_binding_store(snakemake.input.dataset))
    ds = extract_model(
        key,
        params.entry,
        snakemake.output[0],
        image_sets={name: binding_sets[name] for name in settings["image_sets"]},
        folder=params.folder,
        batch_size=params.batch_size,
        device=params.device,
        precision=params.precision,
        zoo_dir=zoo_dir_of(snakemake.input.zoo),
        # inputs: digests of the weights files and folders read (not Snakemake inputs)
        config={
            "models": {key: dict(params.entry)},
            "embeddings": settings,
            "inputs": dict(params.inputs),
        },
    )
    log.info(
        "wrote %s: %d images, layers %s",
        snakemake.output[0],
        ds.sizes["image"],
        ds["layer"].values.tolist(),
    )
exit_job()
