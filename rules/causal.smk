# The JER intervention (repdiag.binding.causal): zoo runs trained with a regulariser on their
# Jacobian effective rank against the same runs without it. `snakemake binding_causal`.
from repdiag.binding.causal_options import comparisons

CAUSAL_PAIRS = comparisons(config)
# the regularised models and their baselines, each once
CAUSAL_MEMBERS = sorted(set(CAUSAL_PAIRS) | set(CAUSAL_PAIRS.values()))


rule causal_effects:
    input:
        metrics=expand("results/metrics/{model}.json", model=CAUSAL_MEMBERS),
        jacobians=expand("results/jacobians/{model}.zarr", model=CAUSAL_MEMBERS),
        zoo_meta=[
            f"results/zoo/{ZOO_MODEL_RUNS[key]}/meta.json" for key in CAUSAL_MEMBERS
        ],
    output:
        effects=report(
            "results/binding_causal/effects.csv",
            caption="../report/causal_effects.rst",
            category="JER intervention",
        ),
        correlations="results/binding_causal/correlations.csv",
        models="results/binding_causal/models.csv",
        summary=report(
            "results/binding_causal/summary.md",
            caption="../report/causal_effects.rst",
            category="JER intervention",
        ),
    log:
        log_file("causal_effects", "all"),
    benchmark:
        bench_file("causal_effects", "all")
    conda:
        "../envs/analysis.yaml"
    threads: 1
    params:
        comparisons=CAUSAL_PAIRS,
        models={
            key: {"family": MODELS[key]["family"], "source": MODELS[key]["source"]}
            for key in CAUSAL_MEMBERS
        },
        stats=seeded(config["stats"], config),
    script:
        "../workflow_scripts/causal_effects.py"


rule plot_causal:
    input:
        effects="results/binding_causal/effects.csv",
        models="results/binding_causal/models.csv",
    output:
        png=report(
            "results/figures/binding_causal.png",
            caption="../report/causal_figure.rst",
            category="JER intervention",
        ),
        pdf="results/figures/binding_causal.pdf",
    log:
        log_file("plot_causal", "all"),
    benchmark:
        bench_file("plot_causal", "all")
    conda:
        "../envs/analysis.yaml"
    threads: 1
    params:
        comparisons=CAUSAL_PAIRS,
        readout=config["stats"]["readout"],
    script:
        "../workflow_scripts/plot_causal.py"


if CAUSAL_PAIRS:
    final_output("binding_causal", rules.causal_effects, rules.plot_causal)
