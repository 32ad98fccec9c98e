"""repdiag.core.slurm: sacct's "CANCELLED by <uid>" must reach the SLURM plugin as CANCELLED."""

from __future__ import annotations

import asyncio
import logging
import shlex

import pytest

from repdiag.core import slurm as slurm_compat
from repdiag.core.slurm import base_state, normalising, patch_slurm_status

plugin = pytest.importorskip("snakemake_executor_plugin_slurm")


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("CANCELLED by 0", "CANCELLED"),
        ("CANCELLED by 1000", "CANCELLED"),
        ("CANCELLED", "CANCELLED"),
        ("COMPLETED", "COMPLETED"),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
        (" RUNNING ", "RUNNING"),
        ("", ""),
    ],
)
def test_base_state(state: str, expected: str) -> None:
    assert base_state(state) == expected


def test_normalising_wraps_a_query_and_passes_failures_through() -> None:
    async def query(command, logger):
        if command == "fail":
            return None, None
        return {"7": "CANCELLED by 0", "7_1": "TIMEOUT", "8": "PENDING"}, 0.5

    wrapped = normalising(query)
    states = asyncio.run(wrapped("ok", None))
    assert states == ({"7": "CANCELLED", "7_1": "TIMEOUT", "8": "PENDING"}, 0.5)
    assert asyncio.run(wrapped("fail", None)) == (None, None)


def test_patch_makes_the_real_plugin_see_cancelled_jobs() -> None:
    """The plugin's own status query (a subprocess) returns CANCELLED, as its fail list needs."""
    assert patch_slurm_status()
    patched = plugin.query_job_status
    assert patch_slurm_status() and plugin.query_job_status is patched  # idempotent
    sacct_like = "printf " + shlex.quote("7|CANCELLED by 0\n8|COMPLETED\n9|RUNNING\n")
    states, seconds = asyncio.run(plugin.query_job_status(sacct_like, logging.getLogger()))
    assert states == {"7": "CANCELLED", "8": "COMPLETED", "9": "RUNNING"}
    assert seconds >= 0


def test_patch_warns_and_gives_up_when_the_plugin_changed(monkeypatch, caplog) -> None:
    monkeypatch.delattr(plugin, "query_job_status")
    with caplog.at_level(logging.WARNING, logger=slurm_compat.__name__):
        assert not patch_slurm_status()
    assert "query_job_status" in caplog.text


def test_patch_is_a_no_op_without_the_plugin(monkeypatch) -> None:
    monkeypatch.setattr(slurm_compat, "PLUGIN", "no_such_plugin_module")
    assert not patch_slurm_status()


def test_jacobian_runtimes_per_model_and_attempt(tmp_path) -> None:
    from repdiag.core.slurm import JACOBIAN_RUNTIME_MIN, jacobian_runtime, runtime_minutes

    assert runtime_minutes(0.01) == 30  # at least 30 minutes
    assert runtime_minutes(2.0) == 180  # 1.5 x 120
    assert runtime_minutes(1.001) == 91  # rounded up
    table = tmp_path / "jacobian_runtimes.yaml"
    assert jacobian_runtime("clip_l14", 1, table) == JACOBIAN_RUNTIME_MIN  # no table yet
    table.write_text("clip_l14: 300\nresnet50: 45\n")
    assert jacobian_runtime("clip_l14", 1, table) == 300
    assert jacobian_runtime("clip_l14", 2, table) == 600  # a retry resumes and gets longer
    assert jacobian_runtime("resnet50", 3, table) == 135
    assert jacobian_runtime("unknown", 1, table) == JACOBIAN_RUNTIME_MIN
    table.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="expected a mapping model -> minutes"):
        jacobian_runtime("clip_l14", 1, table)
