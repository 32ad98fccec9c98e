# The embedded zoo: small timm encoders trained on synthetic scenes, one job per run
# (repdiag.encoders.zoo). Only runs named by a model with `source: zoo` are trained.
import repdiag.binding.outputs
import repdiag.encoders.zoo.spec

ZOO_RUNS = repdiag.encoders.zoo.spec.zoo_runs(config)
# regularised runs also write their cumulative push (rule train_zoo_pushed)
PUSHED_RUNS = repdiag.encoders.zoo.spec.pushed_runs(config)
PLAIN_RUNS = [run for run in ZOO_RUNS if run not in PUSHED_RUNS]
# the runs of the main study's models (the JER intervention's are binding_causal's)
BINDING_ZOO_RUNS = repdiag.binding.outputs.zoo_runs_of(BINDING_MODELS)


rule train_zoo:
    output:
        model="results/zoo/{objective}/model.safetensors",
        meta="results/zoo/{objective}/meta.json",
        curve="results/zoo/{objective}/curve.csv",
    log:
        log_file("train_zoo", "{objective}"),
    benchmark:
        bench_file("train_zoo", "{objective}")
    wildcard_constraints:
        objective=one_of(PLAIN_RUNS, "NO_ZOO_RUNS"),
    priority: priority_of("binding")
    conda:
        "../../envs/torch.yaml"
    threads: config["zoo"]["threads"]
    resources:
        gpu=0 if config["zoo"]["device"] == "cpu" else 1,
    params:
        spec=lambda wildcards: repdiag.encoders.zoo.spec.run_spec(
            config, wildcards.objective
        ),
        device=config["zoo"]["device"],
    script:
        "../../workflow_scripts/binding_train_zoo.py"


use rule train_zoo as train_zoo_pushed with:
    output:
        model="results/zoo/{objective}/model.safetensors",
        meta="results/zoo/{objective}/meta.json",
        curve="results/zoo/{objective}/curve.csv",
        push="results/zoo/{objective}/push.safetensors",
    log:
        log_file("train_zoo", "{objective}"),
    benchmark:
        bench_file("train_zoo", "{objective}")
    wildcard_constraints:
        objective=one_of(PUSHED_RUNS, "NO_PUSHED_RUNS"),


rule plot_zoo_curves:
    input:
        curves=expand("results/zoo/{objective}/curve.csv", objective=BINDING_ZOO_RUNS),
        meta=expand("results/zoo/{objective}/meta.json", objective=BINDING_ZOO_RUNS),
    output:
        png=reported("results/figures/zoo_curves.png", "zoo_curves", "Zoo"),
        pdf="results/figures/zoo_curves.pdf",
    log:
        log_file("plot_zoo_curves", "zoo"),
    benchmark:
        bench_file("plot_zoo_curves", "zoo")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        runs=BINDING_ZOO_RUNS,
    script:
        "../../workflow_scripts/binding_plot_zoo_curves.py"
