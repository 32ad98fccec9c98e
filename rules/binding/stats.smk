# The analysis across models (repdiag.binding.analysis, repdiag.common.statistics, repdiag.binding.plots): one table of every
# model, the statistics of the binding paper, its figures and a digest, all annotated for
# `snakemake --report results/report.html`.
import repdiag.binding.outputs


rule aggregate_models:
    input:
        metrics=expand("results/metrics/{model}.json", model=BINDING_MODELS),
        jacobians=expand("results/jacobians/{model}.zarr", model=BINDING_MODELS),
        zoo_meta=zoo_files(MODELS, BINDING_ZOO_MODELS, "meta.json"),
    output:
        models=reported("results/tables/models.csv", "models", "Tables", "Models"),
        depth=reported(
            "results/tables/depth_profiles.csv", "depth_table", "Tables", "Models"
        ),
        spectra=reported(
            "results/tables/spectra.csv", "spectra_table", "Tables", "Models"
        ),
    log:
        log_file("aggregate_models", "all"),
    benchmark:
        bench_file("aggregate_models", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        models=repdiag.binding.outputs.aggregate_models(config, BINDING_MODELS),
        # sorted: the order of models in the file is no change
        zoo_models=BINDING_ZOO_MODELS,
        stats=repdiag.binding.outputs.aggregate_stats(config),
    script:
        "../../workflow_scripts/binding_aggregate_models.py"


rule stats_tables:
    input:
        models="results/tables/models.csv",
        depth="results/tables/depth_profiles.csv",
    output:
        correlations=reported(
            "results/tables/correlations.csv", "correlations", "Tables", "Statistics"
        ),
        ols=reported("results/tables/ols.csv", "ols", "Tables", "Statistics"),
        ols_summary=reported(
            "results/tables/ols_summary.txt", "ols_summary", "Tables", "Statistics"
        ),
        partial=reported(
            "results/tables/partial.csv", "partial", "Tables", "Statistics"
        ),
        families=reported(
            "results/tables/families.csv", "families", "Tables", "Statistics"
        ),
        robustness=reported(
            "results/tables/robustness.csv", "robustness", "Tables", "Statistics"
        ),
        dose_series=reported(
            "results/tables/dose_series.csv", "dose_series", "Tables", "Statistics"
        ),
        between_within=reported(
            "results/tables/between_within.csv",
            "between_within",
            "Tables",
            "Statistics",
        ),
        paper_comparison=reported(
            "results/tables/paper_comparison.csv", "paper_comparison", "Summary"
        ),
    log:
        log_file("stats_tables", "all"),
    benchmark:
        bench_file("stats_tables", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        stats=seeded(config["stats"], config),
    script:
        "../../workflow_scripts/binding_stats_tables.py"


rule plot_metric_scatter:
    input:
        models="results/tables/models.csv",
    output:
        png=reported("results/figures/metric_scatter.png", "metric_scatter", "Figures"),
        pdf="results/figures/metric_scatter.pdf",
    log:
        log_file("plot_metric_scatter", "all"),
    benchmark:
        bench_file("plot_metric_scatter", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        readout=config["stats"]["readout"],
        binding_score=config["stats"]["binding_score"],
        covariates=config["stats"]["covariates"],
    script:
        "../../workflow_scripts/binding_plot_metric_scatter.py"


rule plot_dose_series:
    input:
        models="results/tables/models.csv",
    output:
        png=reported("results/figures/dose_series.png", "dose_series_figure", "Figures"),
        pdf="results/figures/dose_series.pdf",
    log:
        log_file("plot_dose_series", "all"),
    benchmark:
        bench_file("plot_dose_series", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        readout=config["stats"]["readout"],
        binding_score=config["stats"]["binding_score"],
    script:
        "../../workflow_scripts/binding_plot_dose_series.py"


rule plot_jacobian_spectra:
    input:
        spectra="results/tables/spectra.csv",
    output:
        png=reported(
            "results/figures/jacobian_spectra.png", "jacobian_spectra", "Figures"
        ),
        pdf="results/figures/jacobian_spectra.pdf",
    log:
        log_file("plot_jacobian_spectra", "all"),
    benchmark:
        bench_file("plot_jacobian_spectra", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../workflow_scripts/binding_plot_jacobian_spectra.py"


rule plot_depth_profiles:
    input:
        depth="results/tables/depth_profiles.csv",
    output:
        png=reported("results/figures/depth_profiles.png", "depth_profiles", "Figures"),
        pdf="results/figures/depth_profiles.pdf",
    log:
        log_file("plot_depth_profiles", "all"),
    benchmark:
        bench_file("plot_depth_profiles", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        jer_formula=config["stats"]["jer_formula"],
        probe_set=config["stats"]["probe_set"],
    script:
        "../../workflow_scripts/binding_plot_depth_profiles.py"


rule plot_readouts:
    input:
        models="results/tables/models.csv",
    output:
        png=reported("results/figures/readouts.png", "readouts", "Figures"),
        pdf="results/figures/readouts.pdf",
    log:
        log_file("plot_readouts", "all"),
    benchmark:
        bench_file("plot_readouts", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    script:
        "../../workflow_scripts/binding_plot_readouts.py"


rule summarise:
    input:
        models="results/tables/models.csv",
        correlations="results/tables/correlations.csv",
        ols="results/tables/ols.csv",
        paper_comparison="results/tables/paper_comparison.csv",
        dose_series="results/tables/dose_series.csv",
        depth_profiles="results/tables/depth_profiles.csv",
        zoo_curves=expand("results/zoo/{run}/curve.csv", run=BINDING_ZOO_RUNS),
    output:
        reported("results/summary.md", "summary", "Summary"),
    log:
        log_file("summarise", "all"),
    benchmark:
        bench_file("summarise", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        stats=seeded(config["stats"], config),
    script:
        "../../workflow_scripts/binding_summarise.py"
