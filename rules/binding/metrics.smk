# Binding accuracy per readout, the Same/Different probe and the geometry metrics, per model and
# layer, from the binding dataset and the model's embedding store (repdiag.binding.metrics).


rule compute_metrics:
    input:
        dataset="results/datasets/binding.zarr",
        embeddings="results/embeddings/{model}.zarr",
    output:
        "results/metrics/{model}.json",
    log:
        log_file("compute_metrics"),
    benchmark:
        bench_file("compute_metrics")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        metrics=config["metrics"],
        seed=config["seed"],
        family=lambda wildcards: MODELS[wildcards.model]["family"],
        source=lambda wildcards: MODELS[wildcards.model]["source"],
    script:
        "../../workflow_scripts/binding_compute_metrics.py"
