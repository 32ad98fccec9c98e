"""On the paper config, every GPU rule holds exactly one gpu in the dry run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import copy_workflow, snakemake

GPU_RULES = {"extract_embeddings", "jacobian_spectra", "identifiability_cell", "alignment_cell"}


def test_paper_dry_run_gives_each_gpu_job_one_gpu(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    proc = snakemake(
        workdir, "-n", "--cores", "8", "--resources", "gpu=2", "--configfile", "config/paper.yaml"
    )
    text = proc.stdout + proc.stderr
    gpus_by_rule: dict[str, set[int]] = {}
    for block in re.split(r"\n\s*\n", text):
        rule = re.search(r"^\s*(?:local)?rule (\w+):", block, re.MULTILINE)
        gpu = re.search(r"resources: .*\bgpu=(\d+)", block)
        if rule and gpu:
            gpus_by_rule.setdefault(rule.group(1), set()).add(int(gpu.group(1)))
    for rule in GPU_RULES:
        assert gpus_by_rule.get(rule) == {1}, (rule, gpus_by_rule)
    assert gpus_by_rule["render_binding"] == {0}
    assert len(re.findall(r"rule jacobian_spectra:", text)) == 26 + 7  # encoders + controls
