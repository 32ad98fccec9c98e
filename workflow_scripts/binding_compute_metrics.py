"""Rule compute_metrics: per-layer binding, probe and geometry metrics of one model -> JSON."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.metrics.model_metrics import compute_model_metrics
    from repdiag.binding.metrics.options import MetricsSettings

    metrics = compute_model_metrics(
        snakemake.input.dataset,
        snakemake.input.embeddings,
        model=snakemake.wildcards.model,
        family=snakemake.params.family,
        source=snakemake.params.source,
        settings=MetricsSettings.from_config(snakemake.params.metrics),
        seed=snakemake.params.seed,
    )
    write_json(snakemake.output[0], metrics)
    log.info("wrote %s", snakemake.output[0])
exit_job()
