# The family comparison at the binding budget (repdiag.binding.family_options): the objectives of
# the series named in binding_families.series, trained where self-supervision binds, with the
# config's controls, through the main study's aggregation, statistics and digest.
# `snakemake binding_families`; its tables and figure in results/binding_families/.
import repdiag.binding.family_options
import repdiag.binding.outputs

FAMILY_MEMBERS = repdiag.binding.family_options.family_members(config)
FAMILY_ZOO_MODELS = zoo_models_of({key: MODELS[key] for key in FAMILY_MEMBERS})
FAMILY_ZOO_RUNS = zoo_runs_of({key: MODELS[key] for key in FAMILY_MEMBERS})
FAMILIES_DIR = repdiag.binding.outputs.FAMILIES_DIR
FAMILY_STATS = repdiag.binding.outputs.family_stats(config)


use rule aggregate_models as family_aggregate with:
    input:
        metrics=expand("results/metrics/{model}.json", model=FAMILY_MEMBERS),
        jacobians=expand("results/jacobians/{model}.zarr", model=FAMILY_MEMBERS),
        zoo_meta=zoo_files(MODELS, FAMILY_ZOO_MODELS, "meta.json"),
    output:
        models=f"{FAMILIES_DIR}/models.csv",
        depth=f"{FAMILIES_DIR}/depth_profiles.csv",
        spectra=f"{FAMILIES_DIR}/spectra.csv",
    log:
        log_file("family_aggregate", "all"),
    benchmark:
        bench_file("family_aggregate", "all")
    priority: 0
    params:
        models=repdiag.binding.outputs.aggregate_models(config, FAMILY_MEMBERS),
        zoo_models=FAMILY_ZOO_MODELS,
        stats=repdiag.binding.outputs.aggregate_stats(
            config, FAMILY_STATS["binding_score"]
        ),


use rule stats_tables as family_tables with:
    input:
        models=f"{FAMILIES_DIR}/models.csv",
        depth=f"{FAMILIES_DIR}/depth_profiles.csv",
    output:
        correlations=f"{FAMILIES_DIR}/correlations.csv",
        ols=f"{FAMILIES_DIR}/ols.csv",
        ols_summary=f"{FAMILIES_DIR}/ols_summary.txt",
        partial=f"{FAMILIES_DIR}/partial.csv",
        families=f"{FAMILIES_DIR}/families.csv",
        robustness=f"{FAMILIES_DIR}/robustness.csv",
        dose_series=f"{FAMILIES_DIR}/dose_series.csv",
        between_within=f"{FAMILIES_DIR}/between_within.csv",
        paper_comparison=f"{FAMILIES_DIR}/paper_comparison.csv",
        primary=f"{FAMILIES_DIR}/primary.csv",
        within_run=f"{FAMILIES_DIR}/within_run.csv",
    log:
        log_file("family_tables", "all"),
    benchmark:
        bench_file("family_tables", "all")
    priority: 0
    params:
        stats=seeded(FAMILY_STATS, config),
        primary=config["binding_families"]["primary"],


use rule plot_metric_scatter as family_scatter with:
    input:
        models=f"{FAMILIES_DIR}/models.csv",
    output:
        png=f"{FAMILIES_DIR}/metric_scatter.png",
        pdf=f"{FAMILIES_DIR}/metric_scatter.pdf",
    log:
        log_file("family_scatter", "all"),
    benchmark:
        bench_file("family_scatter", "all")
    priority: 0
    params:
        readout=FAMILY_STATS["readout"],
        binding_score=FAMILY_STATS["binding_score"],
        covariates=FAMILY_STATS["covariates"],


use rule summarise as family_summary with:
    input:
        models=f"{FAMILIES_DIR}/models.csv",
        correlations=f"{FAMILIES_DIR}/correlations.csv",
        ols=f"{FAMILIES_DIR}/ols.csv",
        paper_comparison=f"{FAMILIES_DIR}/paper_comparison.csv",
        dose_series=f"{FAMILIES_DIR}/dose_series.csv",
        depth_profiles=f"{FAMILIES_DIR}/depth_profiles.csv",
        primary=f"{FAMILIES_DIR}/primary.csv",
        within_run=f"{FAMILIES_DIR}/within_run.csv",
        zoo_curves=expand("results/zoo/{run}/curve.csv", run=FAMILY_ZOO_RUNS),
    output:
        f"{FAMILIES_DIR}/summary.md",
    log:
        log_file("family_summary", "all"),
    benchmark:
        bench_file("family_summary", "all")
    priority: 0
    params:
        stats=seeded(FAMILY_STATS, config),
