"""Rule summarise: results/summary.md, a digest of the headline numbers of this run."""

from pathlib import Path

from repdiag.core.runtime import exit_job, script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads):
    from repdiag.binding.analysis.options import StatsSettings
    from repdiag.binding.analysis.summary import SUMMARY_TABLES, summary_markdown, zoo_curves
    from repdiag.common.tables import read_table

    settings = StatsSettings.from_config(snakemake.params.stats)
    inputs = dict(snakemake.input.items())
    tables = {name: read_table(path) for name, path in inputs.items() if name in SUMMARY_TABLES}
    models = read_table(snakemake.input.models)
    zoo = zoo_curves(snakemake.input.zoo_curves)
    tables_dir = Path(snakemake.input.models).parent.as_posix()
    write_text(snakemake.output[0], summary_markdown(models, tables, settings, zoo, tables_dir))
exit_job()
