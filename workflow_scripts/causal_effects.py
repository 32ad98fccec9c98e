"""Rule causal_effects: regularised zoo models against their baselines -> results/binding_causal/."""

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.causal import (
    causal_correlations,
    causal_effects,
    causal_markdown,
    final_jer_by_image,
    regulariser_of,
)
from repdiag.binding.stats_options import StatsSettings
from repdiag.common.tables import write_csv
from repdiag.core.runtime import script_logging
from repdiag.core.store import write_text

with script_logging(snakemake.log[0], snakemake.threads) as log:
    settings = StatsSettings.from_config(snakemake.params.stats)
    models = snakemake.params.models
    pairs = snakemake.params.comparisons
    metrics = dict(zip(models, snakemake.input.metrics, strict=True))
    jacobians = dict(zip(models, snakemake.input.jacobians, strict=True))
    zoo_meta = dict(zip(models, snakemake.input.zoo_meta, strict=True))
    table = aggregate(models, metrics, jacobians, settings, zoo_meta).models
    jer = {
        key: final_jer_by_image(
            jacobians[key], settings.jer_formula, str(row["final_layer"]), settings.probe_set
        )
        for key, row in table.set_index("model").iterrows()
    }
    table["jer"] = table["model"].map(lambda key: float(jer[key].mean()))  # final layer always
    regularisers = {key: regulariser_of(zoo_meta[key]) for key in pairs}
    effects = causal_effects(table, jer, pairs, regularisers, settings)
    correlations = causal_correlations(table, pairs, settings)
    log.info(
        "%d comparisons: JER moved as intended in %d, binding changed in %d",
        len(effects),
        int(effects["manipulated"].sum()),
        int(effects["binding_changed"].sum()),
    )
    write_csv(effects, snakemake.output.effects)
    write_csv(correlations, snakemake.output.correlations)
    write_csv(table, snakemake.output.models)
    write_text(snakemake.output.summary, causal_markdown(effects, correlations, settings))
