# The embedded zoo: small timm encoders trained on synthetic scenes, one job per run
# (repdiag.encoders.zoo). Only runs named by a model with `source: zoo` are trained.
import repdiag.encoders.zoo.spec

TRAINED_RUNS = repdiag.encoders.zoo.spec.trained_runs(config)
# regularised runs also write their cumulative push (rule train_zoo_pushed)
PUSHED_RUNS = repdiag.encoders.zoo.spec.pushed_runs(config)
# runs with save_at also write those steps (rule train_zoo_saving), each copied out as a run of
# its own by rule zoo_checkpoint from saved.safetensors (SAVED_RUNS: the steps some model uses)
SAVING_RUNS = repdiag.encoders.zoo.spec.saving_runs(config)
SAVED_RUNS = repdiag.encoders.zoo.spec.saved_runs(config)
PLAIN_RUNS = [
    run for run in TRAINED_RUNS if run not in PUSHED_RUNS and run not in SAVING_RUNS
]


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


use rule train_zoo as train_zoo_saving with:
    output:
        model="results/zoo/{objective}/model.safetensors",
        meta="results/zoo/{objective}/meta.json",
        curve="results/zoo/{objective}/curve.csv",
        saved="results/zoo/{objective}/saved.safetensors",
    log:
        log_file("train_zoo", "{objective}"),
    benchmark:
        bench_file("train_zoo", "{objective}")
    wildcard_constraints:
        objective=one_of(SAVING_RUNS, "NO_SAVING_RUNS"),


rule zoo_checkpoint:
    input:
        saved=lambda wildcards: "results/zoo/{}/saved.safetensors".format(
            repdiag.encoders.zoo.spec.saved_parent(config, wildcards.objective)
        ),
        run_meta=lambda wildcards: "results/zoo/{}/meta.json".format(
            repdiag.encoders.zoo.spec.saved_parent(config, wildcards.objective)
        ),
    output:
        model="results/zoo/{objective}/model.safetensors",
        meta="results/zoo/{objective}/meta.json",
        curve="results/zoo/{objective}/curve.csv",
    log:
        log_file("zoo_checkpoint", "{objective}"),
    benchmark:
        bench_file("zoo_checkpoint", "{objective}")
    wildcard_constraints:
        objective=one_of(SAVED_RUNS, "NO_SAVED_RUNS"),
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        step=lambda wildcards: config["zoo"]["objectives"][wildcards.objective][
            "stop_at"
        ],
    script:
        "../../workflow_scripts/binding_zoo_checkpoint.py"


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
