"""Rule extract_embeddings on config/test.yaml: labelled stores per model, nothing reruns; paper config plans."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import yaml

from repdiag.encoders.embeddings import read_embeddings
from tests.conftest import copy_workflow
from tests.planning import PlanError, plan, tiny_config, wildcard_values, write_config

pytestmark = pytest.mark.workflow


def test_every_model_has_a_labelled_embeddings_store(workflow_run):
    config = yaml.safe_load((workflow_run / "config/test.yaml").read_text())
    binding = xr.open_zarr(workflow_run / "results/datasets/binding.zarr")
    n_q, n_c, n_p = binding.sizes["query"], binding.sizes["candidate"], binding.sizes["pair"]
    for key, entry in config["models"].items():
        ds = xr.open_zarr(workflow_run / f"results/embeddings/{key}.zarr")
        assert ds.sizes["image"] == n_q + n_q * n_c + 2 * n_p
        assert ds["image_set"].dims == ("image",) and str(ds["image"].values[0]) == "query/q00000"
        layers = [str(name) for name in ds["layer"].values]
        assert (
            "final" in layers and layers.index("final") >= len(layers) - 2
        )  # blocks..., final[, head]
        for layer in layers:
            array = ds[f"emb_{layer}"]
            assert array.dims == ("image", f"dim_{layer}") and array.dtype == np.float32
            assert np.isfinite(array.values).all()
        assert ds.attrs["model"] == key and ds.attrs["family"] == entry["family"]
        assert (
            ds.attrs["pooling"] in ("cls", "mean")
            and ds.attrs["provenance"]["config"]["models"][key]["id"] == entry["id"]
        )
        path = workflow_run / f"results/embeddings/{key}.zarr"
        d = ds.sizes["dim_final"]
        assert read_embeddings(path, "final", "candidate").shape == (n_q, n_c, d)
        assert read_embeddings(path, "final", "pair").shape == (n_p, 2, d)
        log = (workflow_run / f"logs/extract_embeddings/{key}.log").read_text()
        assert f"{key} embeddings: {ds.sizes['image']}/{ds.sizes['image']}" in log


def test_rerun_with_nothing_changed_runs_nothing(completed):
    config = yaml.safe_load((completed / "config/test.yaml").read_text())
    targets = [f"results/embeddings/{key}.zarr" for key in config["models"]]
    assert plan(completed, *targets) == []


def test_paper_config_validates_and_plans_every_encoder(tmp_path):
    workdir = copy_workflow(tmp_path / "paper")
    jobs = plan(workdir, configfiles=["config/paper.yaml"])
    paper = yaml.safe_load((workdir / "config/paper.yaml").read_text())["models"]
    assert len([k for k, e in paper.items() if e["family"] != "control"]) == 26
    assert len([k for k, e in paper.items() if e["family"] == "control"]) == 7
    assert wildcard_values(jobs, "extract_embeddings", "model") == sorted(paper)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"source": "timm", "id": "vit_tiny_patch16_22"},
            "models.bad.id: 'vit_tiny_patch16_22' is not a timm model",
        ),
        (
            {"source": "checkpoint", "id": "resnet18", "weights": "w.pth"},
            "models.bad.weights: 'w.pth' is not a .safetensors file",
        ),
        (
            {"source": "python", "id": "no_colon"},
            "models.bad.id: 'no_colon' must be 'package.module:callable'",
        ),
    ],
)
def test_bad_model_entries_fail_before_any_job(tmp_path, entry, message):
    workdir = copy_workflow(tmp_path / "bad")
    config_path = workdir / "config/test.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["models"]["bad"] = {"family": "other", **entry}
    config_path.write_text(yaml.safe_dump(config))
    with pytest.raises(PlanError) as refused:
        plan(workdir)
    assert message in str(refused.value)
    assert not (workdir / "results").exists()


def test_extraction_runs_under_the_jacobian_stages_precision(tmp_path):
    """Embeddings and Jacobians of a model come from one network: the extraction jobs take
    jacobians.precision (repdiag.encoders.embeddings records it with the numerics)."""
    workdir = copy_workflow(tmp_path / "wf")
    write_config(workdir, tiny_config(jacobians={"precision": "bf16"}))
    jobs = [job for job in plan(workdir) if job.rule == "extract_embeddings"]
    assert jobs and {job.params["precision"] for job in jobs} == {"bf16"}
