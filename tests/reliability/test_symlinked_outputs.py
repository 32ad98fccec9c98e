"""Writes never follow a symlink: a link anywhere under results/ or logs/ (a benchmark file that
Snakemake itself would write, deep under logs/benchmarks/) stops the workflow when Snakemake reads
the Snakefile, before any job, naming the link; the file it points to is untouched."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import copy_workflow, plan_in_process


def test_a_benchmark_file_linked_outside_the_tree_stops_the_workflow(tmp_path: Path) -> None:
    """Before: a real run succeeded and overwrote the outside file (the check stopped at depth 2
    and looked at folders only)."""
    workdir = copy_workflow(tmp_path / "wf")
    victim = tmp_path / "victim.tsv"
    victim.write_text("precious\n")
    bench = workdir / "logs" / "benchmarks" / "render_binding"
    bench.mkdir(parents=True)
    (bench / "binding.tsv").symlink_to(victim)
    error = plan_in_process(workdir, workdir / "config" / "test.yaml")
    assert error is not None
    assert "logs/benchmarks/render_binding/binding.tsv resolves to" in error, error[-2000:]
    assert str(victim) in error
    assert victim.read_text() == "precious\n"
    assert not (workdir / "results").exists()
