"""Rule sugarcrepe_score (gpu=1): one image-text model -> results/sugarcrepe/<model>.json."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before open_clip imports huggingface_hub

from repdiag.core.gpu import gpu_slot
from repdiag.core.runtime import exit_job, script_logging, select_device
from repdiag.core.store import provenance, write_json

with script_logging(snakemake.log[0], snakemake.threads) as log, gpu_slot():
    from repdiag.sugarcrepe.data import ScoringSettings
    from repdiag.sugarcrepe.scoring import evaluate_model

    key, params = snakemake.wildcards.model, snakemake.params
    device = select_device(params.device)
    settings = ScoringSettings.from_config(params.sugarcrepe)
    result = evaluate_model(key, params.entry, settings, device=device)
    result["provenance"] = provenance(
        {
            "models": {key: dict(params.entry)},
            "sugarcrepe": dict(params.sugarcrepe),
            "inputs": dict(params.inputs),
        },
        seed=params.sugarcrepe["seed"],
    )
    write_json(snakemake.output[0], result)
    log.info("wrote %s", snakemake.output[0])
exit_job()
