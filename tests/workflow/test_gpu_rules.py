"""On the paper config, every GPU rule holds exactly one gpu and every other rule none."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import copy_workflow
from tests.planning import plan, rule_counts

GPU_RULES = {"extract_embeddings", "jacobian_spectra"}
# small cells run on CPU cores unless config small_jobs_device asks for a GPU
SMALL_CELLS = {"identifiability_cell", "alignment_cell", "alignment_real"}


def test_paper_plan_gives_each_gpu_job_one_gpu_and_small_cells_none(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    jobs = plan(workdir, configfiles=["config/paper.yaml"])
    gpus_by_rule: dict[str, set[int]] = {}
    for job in jobs:
        gpus_by_rule.setdefault(job.rule, set()).add(int(job.resources.get("gpu", 0)))
    for rule in GPU_RULES:
        assert gpus_by_rule.get(rule) == {1}, (rule, gpus_by_rule)
    assert SMALL_CELLS <= set(gpus_by_rule), sorted(gpus_by_rule)  # the check is not vacuous
    for rule in SMALL_CELLS:
        assert gpus_by_rule[rule] == {0}, (rule, gpus_by_rule)
    assert gpus_by_rule["render_binding"] == {0}
    assert rule_counts(jobs)["jacobian_spectra"] == 26 + 7  # encoders + controls
