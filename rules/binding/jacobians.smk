# Per-layer Jacobian spectra and JER of every model on the probe images (binding queries, a
# Gaussian-noise control, an optional image folder): a GPU job per model (repdiag.encoders.jacobian).
import repdiag.core.slurm
import repdiag.encoders.entries
import repdiag.encoders.jacobian.options

JACOBIAN_PROBE_FOLDER = repdiag.encoders.jacobian.options.JacobianSettings.from_config(
    config["jacobians"]
).probe_folder()
JACOBIAN_FOLDER_DIGEST = folder_digests(
    ("jacobians.probes.folder.path", JACOBIAN_PROBE_FOLDER)
)


rule jacobian_spectra:
    input:
        dataset=(
            "results/datasets/binding.zarr"
            if config["jacobians"]["probes"]["binding"]["n"] > 0
            else []
        ),
        zoo=lambda wildcards: repdiag.encoders.entries.zoo_files(
            MODELS[wildcards.model]
        ),
        folder=JACOBIAN_PROBE_FOLDER or [],
    output:
        store=directory("results/jacobians/{model}.zarr"),
        summary="results/jacobians/{model}.json",
    log:
        log_file("jacobian_spectra"),
    benchmark:
        bench_file("jacobian_spectra")
    priority: priority_of("binding")
    conda:
        "../../envs/torch.yaml"
    resources:
        gpu=1,
        # SLURM minutes per model (profiles/slurm/jacobian_runtimes.yaml), times the attempt
        runtime=lambda wildcards, attempt: repdiag.core.slurm.jacobian_runtime(
            wildcards.model,
            attempt,
            f"{workflow.basedir}/{repdiag.core.slurm.RUNTIMES_FILE}",
        ),
    params:
        entry=encoder_entry,
        jacobians=config["jacobians"],
        device=config["device"],
        inputs=lambda wildcards: {
            **model_digests(wildcards),
            **JACOBIAN_FOLDER_DIGEST,
        },
    script:
        "../../workflow_scripts/binding_jacobian_spectra.py"
