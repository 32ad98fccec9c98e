# SugarCrepe (natural images, hard negative captions) for the image-text models, with zero-shot
# accuracy as a covariate (repdiag.sugarcrepe.scoring, repdiag.sugarcrepe.report): a GPU
# job per model, a table across models, the partial correlation of JER with SugarCrepe accuracy
# given zero-shot accuracy, a figure and the models table joined with the accuracies.
import repdiag.sugarcrepe.data

SUGARCREPE = config["sugarcrepe"]
SUGARCREPE_MODELS = repdiag.sugarcrepe.data.scored_models(config)
SUGARCREPE_STATS = seeded(config["stats"], config)


# the image folders the scoring jobs read, by manifest (computed only when the branch is on)
SUGARCREPE_FOLDER_DIGEST = (
    folder_digests(
        ("sugarcrepe.images", SUGARCREPE["images"]),
        ("sugarcrepe.zero_shot.folder", SUGARCREPE["zero_shot"]["folder"]),
    )
    if SUGARCREPE["enabled"]
    else {}
)


rule sugarcrepe_score:
    input:
        data=repdiag.sugarcrepe.data.sugarcrepe_files(
            SUGARCREPE["root"], SUGARCREPE["categories"]
        ),
        class_names=(
            [SUGARCREPE["zero_shot"]["class_names"]]
            if SUGARCREPE["zero_shot"]["folder"] is not None
            and isinstance(SUGARCREPE["zero_shot"]["class_names"], str)
            else []
        ),
    output:
        "results/sugarcrepe/{model}.json",
    log:
        log_file("sugarcrepe_score"),
    benchmark:
        bench_file("sugarcrepe_score")
    conda:
        "../envs/torch.yaml"
    threads: 2
    resources:
        gpu=1,
    params:
        # the covariates only enter the tables: changing one reruns no model
        entry=encoder_entry,
        sugarcrepe={
            "root": SUGARCREPE["root"],
            "images": SUGARCREPE["images"],
            "categories": SUGARCREPE["categories"],
            "max_per_category": SUGARCREPE["max_per_category"],
            "batch_size": SUGARCREPE["batch_size"],
            "seed": seeded(SUGARCREPE, config)["seed"],
            "zero_shot": (
                SUGARCREPE["zero_shot"]
                if SUGARCREPE["zero_shot"]["folder"] is not None
                else {"folder": None}
            ),
        },
        device=config["device"],
        inputs=lambda wildcards: {
            **model_digests(wildcards),
            **SUGARCREPE_FOLDER_DIGEST,
        },
    script:
        "../workflow_scripts/sugarcrepe_score.py"


rule sugarcrepe_tables:
    input:
        results=expand("results/sugarcrepe/{model}.json", model=SUGARCREPE_MODELS),
        jacobians=expand("results/jacobians/{model}.zarr", model=SUGARCREPE_MODELS),
    output:
        table=reported(
            "results/tables/sugarcrepe.csv", "sugarcrepe_table", "Tables", "SugarCrepe"
        ),
        partial=reported(
            "results/tables/sugarcrepe_partial.csv",
            "sugarcrepe_partial",
            "Tables",
            "SugarCrepe",
        ),
    log:
        log_file("sugarcrepe_tables", "all"),
    benchmark:
        bench_file("sugarcrepe_tables", "all")
    conda:
        "../envs/analysis.yaml"
    params:
        models={key: MODELS[key]["family"] for key in SUGARCREPE_MODELS},
        zero_shot={
            key: MODELS[key].get("covariates", {}).get("zero_shot_accuracy")
            for key in SUGARCREPE_MODELS
        },
        stats={
            key: SUGARCREPE_STATS[key]
            for key in (
                "n_bootstrap",
                "seed",
                "confidence",
                "min_models",
                "jer_formula",
                "jer_at",
                "probe_set",
            )
        },
    script:
        "../workflow_scripts/sugarcrepe_tables.py"


rule sugarcrepe_figure:
    input:
        table="results/tables/sugarcrepe.csv",
        partial="results/tables/sugarcrepe_partial.csv",
    output:
        png=reported("results/figures/sugarcrepe_jer.png", "sugarcrepe_jer", "Figures"),
        pdf="results/figures/sugarcrepe_jer.pdf",
    log:
        log_file("sugarcrepe_figure", "all"),
    benchmark:
        bench_file("sugarcrepe_figure", "all")
    conda:
        "../envs/analysis.yaml"
    params:
        headline=SUGARCREPE["headline"],
        jer_column=f"jer_{config['stats']['jer_formula']}_{config['stats']['jer_at']}",
    script:
        "../workflow_scripts/sugarcrepe_figure.py"


rule sugarcrepe_models:
    input:
        models="results/tables/models.csv",
        table="results/tables/sugarcrepe.csv",
    output:
        reported(
            "results/tables/models_sugarcrepe.csv",
            "models_sugarcrepe",
            "Tables",
            "SugarCrepe",
        ),
    log:
        log_file("sugarcrepe_models", "all"),
    benchmark:
        bench_file("sugarcrepe_models", "all")
    conda:
        "../envs/analysis.yaml"
    params:
        headline=SUGARCREPE["headline"],
    script:
        "../workflow_scripts/sugarcrepe_models.py"
