"""Rule plot_depth_profiles: mean JER per layer against relative depth, one line per model."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.plots import depth_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    depth = read_table(snakemake.input.depth)
    fig = depth_figure(
        depth, formula=snakemake.params.jer_formula, probe_set=snakemake.params.probe_set
    )
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s (%d models)", *snakemake.output, depth["model"].nunique())
exit_job()
