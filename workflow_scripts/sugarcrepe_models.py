"""Rule sugarcrepe_models: results/tables/models.csv joined with the SugarCrepe accuracies."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads):
    from repdiag.common.tables import read_table, write_csv
    from repdiag.sugarcrepe.report import join_models

    models = read_table(snakemake.input.models)
    table = read_table(snakemake.input.table)
    write_csv(join_models(models, table, snakemake.params.headline), snakemake.output[0])
exit_job()
