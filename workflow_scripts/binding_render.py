"""Rule render_binding: config datasets.binding -> results/datasets/binding.zarr + contact sheet."""

import time

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_store

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.dataset import BindingSettings, chunk_encoding, render_binding_dataset
    from repdiag.binding.plots import contact_sheet

    params = BindingSettings.from_config(snakemake.params.binding)
    start = time.perf_counter()
    ds = render_binding_dataset(params)
    log.info(
        "rendered %d queries x %d candidates and %d pairs at %d px in %.1f s",
        params.n_queries,
        params.n_candidates,
        params.n_pairs,
        params.image_size,
        time.perf_counter() - start,
    )
    write_store(
        snakemake.output.store,
        ds,
        config=params.to_config(),
        seed=params.seed,
        encoding=chunk_encoding(ds),
    )
    contact_sheet(ds, snakemake.output.sheet)
    log.info("wrote %s and %s", snakemake.output.store, snakemake.output.sheet)
exit_job()
