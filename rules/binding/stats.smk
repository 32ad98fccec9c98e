# The analysis across models (repdiag.binding.analysis, repdiag.common.statistics, repdiag.binding.plots): one table of every
# model, the statistics of the binding paper, its figures and a digest, all annotated for
# `snakemake --report results/report.html`.


rule aggregate_models:
    input:
        metrics=expand("results/metrics/{model}.json", model=BINDING_MODELS),
        jacobians=expand("results/jacobians/{model}.zarr", model=BINDING_MODELS),
        zoo_meta=[
            f"results/zoo/{ZOO_MODEL_RUNS[key]}/meta.json"
            for key in sorted(ZOO_MODEL_RUNS)
            if key in BINDING_MODELS
        ],
    output:
        models=report(
            "results/tables/models.csv",
            caption="../../report/models.rst",
            category="Tables",
            subcategory="Models",
        ),
        depth=report(
            "results/tables/depth_profiles.csv",
            caption="../../report/depth_table.rst",
            category="Tables",
            subcategory="Models",
        ),
        spectra=report(
            "results/tables/spectra.csv",
            caption="../../report/spectra_table.rst",
            category="Tables",
            subcategory="Models",
        ),
    log:
        log_file("aggregate_models", "all"),
    benchmark:
        bench_file("aggregate_models", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        models={
            key: {
                "family": entry["family"],
                "source": entry["source"],
                "covariates": entry.get("covariates", {}),
            }
            for key, entry in BINDING_MODELS.items()
        },
        # sorted: the order of models in the file is no change
        zoo_models=sorted(key for key in ZOO_MODEL_RUNS if key in BINDING_MODELS),
        # the stats keys the table reads, and only those (another key changes no row)
        stats={
            key: config["stats"][key]
            for key in ("readout", "jer_formula", "jer_at", "probe_set", "confidence")
        },
    script:
        "../../workflow_scripts/binding_aggregate_models.py"


rule stats_tables:
    input:
        models="results/tables/models.csv",
        depth="results/tables/depth_profiles.csv",
    output:
        correlations=report(
            "results/tables/correlations.csv",
            caption="../../report/correlations.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        ols=report(
            "results/tables/ols.csv",
            caption="../../report/ols.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        ols_summary=report(
            "results/tables/ols_summary.txt",
            caption="../../report/ols_summary.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        partial=report(
            "results/tables/partial.csv",
            caption="../../report/partial.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        families=report(
            "results/tables/families.csv",
            caption="../../report/families.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        robustness=report(
            "results/tables/robustness.csv",
            caption="../../report/robustness.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        dose_series=report(
            "results/tables/dose_series.csv",
            caption="../../report/dose_series.rst",
            category="Tables",
            subcategory="Statistics",
        ),
        paper_comparison=report(
            "results/tables/paper_comparison.csv",
            caption="../../report/paper_comparison.rst",
            category="Summary",
        ),
    log:
        log_file("stats_tables", "all"),
    benchmark:
        bench_file("stats_tables", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        stats=seeded(config["stats"], config),
    script:
        "../../workflow_scripts/binding_stats_tables.py"


rule plot_metric_scatter:
    input:
        models="results/tables/models.csv",
    output:
        png=report(
            "results/figures/metric_scatter.png",
            caption="../../report/metric_scatter.rst",
            category="Figures",
        ),
        pdf="results/figures/metric_scatter.pdf",
    log:
        log_file("plot_metric_scatter", "all"),
    benchmark:
        bench_file("plot_metric_scatter", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        readout=config["stats"]["readout"],
        covariates=config["stats"]["covariates"],
    script:
        "../../workflow_scripts/binding_plot_metric_scatter.py"


rule plot_dose_series:
    input:
        models="results/tables/models.csv",
    output:
        png=report(
            "results/figures/dose_series.png",
            caption="../../report/dose_series_figure.rst",
            category="Figures",
        ),
        pdf="results/figures/dose_series.pdf",
    log:
        log_file("plot_dose_series", "all"),
    benchmark:
        bench_file("plot_dose_series", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        readout=config["stats"]["readout"],
    script:
        "../../workflow_scripts/binding_plot_dose_series.py"


rule plot_jacobian_spectra:
    input:
        spectra="results/tables/spectra.csv",
    output:
        png=report(
            "results/figures/jacobian_spectra.png",
            caption="../../report/jacobian_spectra.rst",
            category="Figures",
        ),
        pdf="results/figures/jacobian_spectra.pdf",
    log:
        log_file("plot_jacobian_spectra", "all"),
    benchmark:
        bench_file("plot_jacobian_spectra", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    script:
        "../../workflow_scripts/binding_plot_jacobian_spectra.py"


rule plot_depth_profiles:
    input:
        depth="results/tables/depth_profiles.csv",
    output:
        png=report(
            "results/figures/depth_profiles.png",
            caption="../../report/depth_profiles.rst",
            category="Figures",
        ),
        pdf="results/figures/depth_profiles.pdf",
    log:
        log_file("plot_depth_profiles", "all"),
    benchmark:
        bench_file("plot_depth_profiles", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        jer_formula=config["stats"]["jer_formula"],
        probe_set=config["stats"]["probe_set"],
    script:
        "../../workflow_scripts/binding_plot_depth_profiles.py"


rule plot_readouts:
    input:
        models="results/tables/models.csv",
    output:
        png=report(
            "results/figures/readouts.png",
            caption="../../report/readouts.rst",
            category="Figures",
        ),
        pdf="results/figures/readouts.pdf",
    log:
        log_file("plot_readouts", "all"),
    benchmark:
        bench_file("plot_readouts", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
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
        zoo_curves=sorted(
            {
                f"results/zoo/{entry['id']}/curve.csv"
                for entry in BINDING_MODELS.values()
                if entry["source"] == "zoo"
            }
        ),
    output:
        report(
            "results/summary.md",
            caption="../../report/summary.rst",
            category="Summary",
        ),
    log:
        log_file("summarise", "all"),
    benchmark:
        bench_file("summarise", "all")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    threads: 1
    params:
        stats=seeded(config["stats"], config),
    script:
        "../../workflow_scripts/binding_summarise.py"
