# The JER intervention (repdiag.binding.causal): per base and seed, the plain, raise, lower,
# sham, geometry and null arms (series named in binding_causal.series). `snakemake binding_causal`.
import repdiag.binding.causal.options
import repdiag.encoders.zoo.spec

CAUSAL_CELLS = repdiag.binding.causal.options.causal_cells(config)
# every arm's model, plain included, once
CAUSAL_MEMBERS = repdiag.binding.causal.options.causal_members(config)
CALIBRATION_RUNS = repdiag.binding.causal.options.calibration_runs(config)
# the arms with a push (every arm but plain): their cumulative push enters the displacement
CAUSAL_PUSHED = repdiag.binding.causal.options.causal_pushed(config)


rule causal_calibration:
    output:
        steps="results/binding_causal/calibration_steps.csv",
        summary="results/binding_causal/calibration.csv",
    log:
        log_file("causal_calibration", "all"),
    benchmark:
        bench_file("causal_calibration", "all")
    conda:
        "../../envs/torch.yaml"
    threads: config["zoo"]["threads"]
    params:
        specs=[
            repdiag.encoders.zoo.spec.run_spec(config, run) for run in CALIBRATION_RUNS
        ],
        calibration=config["binding_causal"]["calibration"],
    script:
        "../../workflow_scripts/binding_causal_calibration.py"


rule causal_effects:
    input:
        metrics=expand("results/metrics/{model}.json", model=CAUSAL_MEMBERS),
        jacobians=expand("results/jacobians/{model}.zarr", model=CAUSAL_MEMBERS),
        zoo_meta=zoo_files(MODELS, CAUSAL_MEMBERS, "meta.json"),
        calibration="results/binding_causal/calibration.csv",
        weights=zoo_files(MODELS, CAUSAL_MEMBERS, "model.safetensors"),
        pushes=zoo_files(MODELS, CAUSAL_PUSHED, "push.safetensors"),
    output:
        arms=reported(
            "results/binding_causal/arms.csv", "causal_effects", "JER intervention"
        ),
        contrasts="results/binding_causal/contrasts.csv",
        displacement="results/binding_causal/displacement.csv",
        per_jer="results/binding_causal/binding_per_jer.csv",
        associations="results/binding_causal/plain_associations.csv",
        models="results/binding_causal/models.csv",
        summary=reported(
            "results/binding_causal/summary.md", "causal_effects", "JER intervention"
        ),
    log:
        log_file("causal_effects", "all"),
    benchmark:
        bench_file("causal_effects", "all")
    conda:
        "../../envs/analysis.yaml"
    params:
        cells=CAUSAL_CELLS,
        models={
            key: {"family": MODELS[key]["family"], "source": MODELS[key]["source"]}
            for key in CAUSAL_MEMBERS
        },
        stats=seeded(config["stats"], config),
        pushed=CAUSAL_PUSHED,
    script:
        "../../workflow_scripts/binding_causal_effects.py"


rule plot_causal:
    input:
        arms="results/binding_causal/arms.csv",
        contrasts="results/binding_causal/contrasts.csv",
        models="results/binding_causal/models.csv",
    output:
        png=reported(
            "results/figures/binding_causal.png", "causal_figure", "JER intervention"
        ),
        pdf="results/figures/binding_causal.pdf",
    log:
        log_file("plot_causal", "all"),
    benchmark:
        bench_file("plot_causal", "all")
    conda:
        "../../envs/analysis.yaml"
    params:
        readout=config["stats"]["readout"],
        binding_score=config["stats"]["binding_score"],
    script:
        "../../workflow_scripts/binding_plot_causal.py"
