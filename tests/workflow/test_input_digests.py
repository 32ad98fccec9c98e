"""Files a job reads that are not Snakemake inputs rerun exactly their jobs when they change.

One copy of the workflow: the binding study of config/test.yaml with two models, a zoo model
and a checkpoint model (a weights file), an embeddings image folder and a Jacobian probe folder.
Every output is created empty and marked done by Snakemake's own touch executor, which records
each job's params (the digests among them, repdiag.core.digests); then each test changes one file
and asks the in-process planner (tests.planning.plan) what reruns, and puts the file back.
Nothing is executed. Two models are the fewest that show a change rerunning exactly one model's
jobs and a shared folder rerunning every model's; each further model or study only adds jobs to
mark done (two per round of the touch executor, about 0.2 s a round) and to plan.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repdiag.cifar.study import run_names
from tests.conftest import copy_workflow
from tests.planning import Planned, mark_done, plan, tiny_config, write_config

# one worker for the module: its module fixtures build and record whole workflows
pytestmark = [pytest.mark.workflow, pytest.mark.xdist_group("workflow/test_input_digests")]

WEIGHTS = Path("weights") / "ck.safetensors"
IMAGES = Path("images")
PROBES = Path("probes")
# every job per model (extraction, Jacobians, metrics: what _reruns reads) is the binding study's
DONE_TARGET = ("binding",)


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    workdir = copy_workflow(tmp_path_factory.mktemp("digests") / "run")
    (workdir / WEIGHTS).parent.mkdir()
    # a safetensors header (the run's start reads it: a checkpoint must not be a pickle), padded
    (workdir / WEIGHTS).write_bytes((2).to_bytes(8, "little") + b"{}" + b"w" * 246)
    for folder in (IMAGES, PROBES):
        (workdir / folder / "sub").mkdir(parents=True)
        (workdir / folder / "a.png").write_bytes(b"a" * 64)
        (workdir / folder / "sub" / "b.png").write_bytes(b"b" * 64)
    config = tiny_config(
        embeddings={"folder": str(IMAGES)},
        jacobians={"probes": {"folder": {"path": str(PROBES), "n": 2}}},
        alignment={"real": {"pairs": []}},  # its pairs name zoo models left out here
    )
    config["models"] = {
        "mae": config["models"]["mae"],
        "ck": {
            "source": "checkpoint",
            "id": "resnet10t",
            "family": "supervised",
            "weights": str(WEIGHTS),
        },
    }
    configfile = write_config(workdir, config, "digests.yaml")
    mark_done(workdir, *DONE_TARGET, configfiles=[configfile])
    assert plan(workdir, *DONE_TARGET, configfiles=[configfile]) == []
    return workdir, configfile


def _reruns(done: tuple[Path, Path]) -> dict[tuple[str, str], str]:
    """(rule, model) -> reason of every planned job that reads a model (model-free jobs left out:
    they only follow from these)."""
    workdir, configfile = done
    jobs: list[Planned] = plan(workdir, *DONE_TARGET, configfiles=[configfile])
    return {(j.rule, j.wildcards["model"]): j.reason for j in jobs if "model" in j.wildcards}


def _rewrite(path: Path, data: bytes) -> tuple[bytes, int]:
    """Write ``data`` to ``path`` with a new mtime; return the old content and mtime_ns."""
    old = (path.read_bytes(), path.stat().st_mtime_ns)
    path.write_bytes(data)
    os.utime(path, ns=(old[1] + 10**9, old[1] + 10**9))
    return old


def _restore(path: Path, old: tuple[bytes, int]) -> None:
    path.write_bytes(old[0])
    os.utime(path, ns=(old[1], old[1]))


def test_a_rewritten_weights_file_reruns_exactly_its_models_jobs(done: tuple[Path, Path]) -> None:
    path = done[0] / WEIGHTS
    old = _rewrite(path, b"v" * 256)
    try:
        reruns = _reruns(done)
    finally:
        _restore(path, old)
    assert set(reruns) == {("extract_embeddings", "ck"), ("jacobian_spectra", "ck"),
                           ("compute_metrics", "ck")}  # fmt: skip
    assert "models.ck.weights" in reruns[("extract_embeddings", "ck")]
    assert "Params have changed" in reruns[("jacobian_spectra", "ck")]
    assert _reruns(done) == {}  # the old bytes back: nothing to do


def test_a_weights_file_touched_without_a_change_reruns_nothing(done: tuple[Path, Path]) -> None:
    path = done[0] / WEIGHTS
    stat = path.stat()
    os.utime(path, ns=(stat.st_mtime_ns + 5 * 10**9, stat.st_mtime_ns + 5 * 10**9))
    try:
        assert _reruns(done) == {}  # its SHA-256 is read again and is the same
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("change", ["rewritten", "added", "touched"])
def test_an_image_folder_change_reruns_the_jobs_reading_it(
    done: tuple[Path, Path], change: str
) -> None:
    """A file of embeddings.folder (at any depth) rewritten, added, or only touched reruns every
    model's extraction and nothing else (the folder's manifest holds names, sizes and mtimes)."""
    workdir = done[0]
    image = workdir / IMAGES / "sub" / "b.png"
    extra = workdir / IMAGES / "c.png"
    old = (image.read_bytes(), image.stat().st_mtime_ns)
    folder_times = (extra.parent.stat().st_atime_ns, extra.parent.stat().st_mtime_ns)
    if change == "rewritten":
        _rewrite(image, b"B" * 64)
    elif change == "touched":
        _rewrite(image, old[0])
    else:
        extra.write_bytes(b"c")
    try:
        reruns = _reruns(done)
    finally:
        _restore(image, old)
        extra.unlink(missing_ok=True)
        os.utime(extra.parent, ns=folder_times)  # the folder itself is a Snakemake input too
    models = {model for _, model in reruns}
    assert {rule for rule, _ in reruns} == {"extract_embeddings", "compute_metrics"}
    assert ("extract_embeddings", "ck") in reruns and len(models) > 1
    # a file added at the top changes the folder's own mtime, which Snakemake sees first
    reason = reruns[("extract_embeddings", "ck")]
    assert "embeddings.folder" in reason or (
        change == "added" and f"input files: {IMAGES}" in reason
    )
    assert _reruns(done) == {}


def test_a_probe_folder_change_reruns_the_jacobian_jobs_only(done: tuple[Path, Path]) -> None:
    image = done[0] / PROBES / "a.png"
    old = _rewrite(image, b"A" * 64)
    try:
        reruns = _reruns(done)
    finally:
        _restore(image, old)
    assert {rule for rule, _ in reruns} == {"jacobian_spectra"}
    assert "jacobians.probes.folder.path" in reruns[("jacobian_spectra", "ck")]


CIFAR_FILES = (Path("config") / "test.yaml", Path("config") / "cifar_smoke.yaml")


def _smoke(workdir: Path) -> dict:
    import yaml

    return yaml.safe_load((workdir / CIFAR_FILES[1]).read_text())["cifar"]


@pytest.fixture(scope="module")
def cifar_done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CIFAR branch on a folder-layout fixture (train/<class>/<image>), every job done."""
    from repdiag.cifar.data import write_fixture

    workdir = copy_workflow(tmp_path_factory.mktemp("cifar") / "run")
    write_fixture(
        workdir / _smoke(workdir)["data_dir"], "folder", n_train_per_class=2, n_test_per_class=1
    )
    mark_done(workdir, "cifar", configfiles=CIFAR_FILES)
    assert plan(workdir, "cifar", configfiles=CIFAR_FILES) == []
    return workdir


@pytest.mark.parametrize("change", ["rewritten", "touched"])
def test_a_cifar_image_change_reruns_every_cifar_run(cifar_done: Path, change: str) -> None:
    """An image inside a class folder changes no mtime Snakemake compares (train/ is the input);
    the train/ manifest in the params reruns every SimCLR run, which all read it."""
    image = next(p for p in sorted((cifar_done / "data").rglob("*.png")) if "train" in p.parts)
    old = _rewrite(image, image.read_bytes()[::-1] if change == "rewritten" else image.read_bytes())
    try:
        jobs = plan(cifar_done, "cifar", configfiles=CIFAR_FILES)
    finally:
        _restore(image, old)
    runs = [job for job in jobs if job.rule == "cifar_simclr"]
    jobs = [job for job in jobs if job.rule != "cifar"]  # the target rule itself
    assert {job.wildcards["run"] for job in runs} == set(run_names(_smoke(cifar_done)))
    assert {job.rule for job in jobs} == {"cifar_simclr", "cifar_tables", "cifar_figure"}
    assert all("cifar.data_dir/train" in job.reason for job in runs)
    assert plan(cifar_done, "cifar", configfiles=CIFAR_FILES) == []


@pytest.fixture(scope="module")
def sugarcrepe_done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The SugarCrepe branch on its test fixture (two tiny open_clip models), every job done."""
    from tests.sugarcrepe.fixture import make_sugarcrepe
    from tests.workflow.test_sugarcrepe import tiny_config as sugarcrepe_config

    workdir = copy_workflow(tmp_path_factory.mktemp("sugarcrepe") / "run")
    make_sugarcrepe(workdir / "data", n_images=6, per_category=3)
    configfile = write_config(workdir, sugarcrepe_config(workdir / "data"), "sugarcrepe.yaml")
    mark_done(workdir, "sugarcrepe", configfiles=[configfile])
    assert plan(workdir, "sugarcrepe", configfiles=[configfile]) == []
    return workdir, configfile


def test_a_sugarcrepe_image_change_reruns_the_scores_only(
    sugarcrepe_done: tuple[Path, Path],
) -> None:
    workdir, configfile = sugarcrepe_done
    image = sorted((workdir / "data" / "val2017").iterdir())[0]
    old = _rewrite(image, image.read_bytes() + b"\0")
    try:
        jobs = plan(workdir, "sugarcrepe", configfiles=[configfile])
    finally:
        _restore(image, old)
    scores = {job.wildcards["model"]: job.reason for job in jobs if job.rule == "sugarcrepe_score"}
    assert set(scores) == {"clip_a", "clip_b"}
    assert all("sugarcrepe.images" in reason for reason in scores.values())
    assert not any(job.rule in ("jacobian_spectra", "extract_embeddings") for job in jobs)
    assert plan(workdir, "sugarcrepe", configfiles=[configfile]) == []
