"""Rule plot_zoo_curves: the training curves of every zoo run in one figure (PNG and PDF)."""

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import read_json

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.encoders.zoo.plot import plot_curves, read_curve

    runs = snakemake.params.runs
    curves = {run: read_curve(path) for run, path in zip(runs, snakemake.input.curves, strict=True)}
    metas = {run: read_json(path) for run, path in zip(runs, snakemake.input.meta, strict=True)}
    plot_curves(curves, metas, snakemake.output.png, snakemake.output.pdf)
    log.info("plotted %d zoo curves", len(runs))
exit_job()
