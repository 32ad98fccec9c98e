# The dose series drawn again (repdiag.binding.replicate_options): the series named in
# binding_replicate.series, every run with a null push, through the main study's aggregation and
# its dose-series analysis, then set beside the main run's dose series verdict by verdict.
# `snakemake binding_replicate` (after `snakemake binding`); results in results/binding_replicate/.
import repdiag.binding.outputs
import repdiag.binding.replicate_options

REPLICATE_MODELS = repdiag.binding.replicate_options.replicate_models(config)
REPLICATE_DIR = repdiag.binding.replicate_options.REPLICATE_DIR


use rule aggregate_models as replicate_aggregate with:
    input:
        metrics=expand("results/metrics/{model}.json", model=REPLICATE_MODELS),
        jacobians=expand("results/jacobians/{model}.zarr", model=REPLICATE_MODELS),
        zoo_meta=zoo_files(MODELS, REPLICATE_MODELS, "meta.json"),
    output:
        models=f"{REPLICATE_DIR}/models.csv",
        depth=f"{REPLICATE_DIR}/depth_profiles.csv",
        spectra=f"{REPLICATE_DIR}/spectra.csv",
    log:
        log_file("replicate_aggregate", "all"),
    benchmark:
        bench_file("replicate_aggregate", "all")
    priority: 0
    params:
        models=repdiag.binding.outputs.aggregate_models(config, REPLICATE_MODELS),
        zoo_models=REPLICATE_MODELS,
        stats=repdiag.binding.outputs.aggregate_stats(config),


rule replicate_comparison:
    input:
        main="results/tables/dose_series.csv",
        models=f"{REPLICATE_DIR}/models.csv",
    output:
        dose_series=f"{REPLICATE_DIR}/dose_series.csv",
        table=f"{REPLICATE_DIR}/comparison.csv",
        markdown=f"{REPLICATE_DIR}/comparison.md",
    log:
        log_file("replicate_comparison", "all"),
    benchmark:
        bench_file("replicate_comparison", "all")
    conda:
        "../../envs/analysis.yaml"
    params:
        stats=seeded(config["stats"], config),
    script:
        "../../workflow_scripts/binding_replicate_comparison.py"
