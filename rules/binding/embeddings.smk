# Per-layer embeddings of every model on the binding images (and an optional image folder):
# results/embeddings/{model}.zarr, one job per model (repdiag.encoders.embeddings).
import repdiag.encoders.entries

EMBEDDINGS_FOLDER_DIGEST = folder_digests(
    ("embeddings.folder", config["embeddings"]["folder"])
)


rule extract_embeddings:
    input:
        dataset="results/datasets/binding.zarr",
        zoo=lambda wildcards: repdiag.encoders.entries.zoo_files(
            MODELS[wildcards.model]
        ),
        folder=config["embeddings"]["folder"] or [],
    output:
        directory("results/embeddings/{model}.zarr"),
    log:
        log_file("extract_embeddings"),
    benchmark:
        bench_file("extract_embeddings")
    priority: priority_of("binding")
    conda:
        "../../envs/torch.yaml"
    resources:
        gpu=1,
    params:
        entry=encoder_entry,
        batch_size=config["embeddings"]["batch_size"],
        image_sets=config["embeddings"]["image_sets"],
        folder=config["embeddings"]["folder"],
        device=config["device"],
        # the Jacobian stage's numerics (TF32 off for fp32), so both stages see one network
        precision=config["jacobians"]["precision"],
        inputs=lambda wildcards: {
            **model_digests(wildcards),
            **EMBEDDINGS_FOLDER_DIGEST,
        },
    script:
        "../../workflow_scripts/binding_extract_embeddings.py"
