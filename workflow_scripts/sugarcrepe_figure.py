"""Rule sugarcrepe_figure: JER against SugarCrepe accuracy, raw and given zero-shot accuracy."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads):
    from repdiag.binding.analysis.columns import metric_label
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table
    from repdiag.sugarcrepe.report import sugarcrepe_figure

    figure = sugarcrepe_figure(
        read_table(snakemake.input.table),
        read_table(snakemake.input.partial),
        snakemake.params.headline,
        jer_label=metric_label(snakemake.params.jer_column),
    )
    save_figure(figure, snakemake.output.png, snakemake.output.pdf)
exit_job()
