"""Workflow outputs of rule render_binding on config/test.yaml, read back with plain xarray."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

pytestmark = pytest.mark.workflow


def _binding_config(workdir: Path) -> dict:
    return yaml.safe_load((workdir / "config" / "test.yaml").read_text())["datasets"]["binding"]


def test_binding_store_opens_with_named_dimensions_and_coordinates(workflow_run: Path) -> None:
    config = _binding_config(workflow_run)
    ds = xr.open_zarr(workflow_run / "results" / "datasets" / "binding.zarr")
    n_q, n_c, n_p = config["n_queries"], config["n_candidates"], config["n_pairs"]
    size, (rows, cols) = config["image_size"], config["grid"]
    assert dict(ds.sizes) == {
        "query": n_q, "candidate": n_c, "pair": n_p, "member": 2, "y": size, "x": size,
        "channel": 3, "slot": rows * cols, "shape_name": len(ds["shape_name"]),
    }  # fmt: skip
    assert ds["candidate_image"].dims == ("query", "candidate", "y", "x", "channel")
    assert ds["pair_image"].dims == ("pair", "member", "y", "x", "channel")
    assert ds["query_shape"].dims == ("query", "slot")
    assert ds["candidate_image"].dtype == np.uint8
    assert list(ds["query"].values[:2]) == ["q00000", "q00001"]
    assert list(ds["pair"].values[-1:]) == [f"p{n_p - 1:05d}"]
    assert list(ds["slot"].values) == [f"r{r}c{c}" for r in range(rows) for c in range(cols)]
    assert list(ds["channel"].values) == ["r", "g", "b"]
    assert list(ds["candidate"].values) == list(range(n_c))
    assert set(ds["shape_name"].values) >= {"circle", "square", "triangle", "cross"}
    correct = ds["correct_index"].values
    assert correct.min() >= 0 and correct.max() < n_c
    assert int(ds["pair_same"].sum()) == n_p // 2
    provenance = ds.attrs["provenance"]
    assert provenance["config"]["n_queries"] == n_q and provenance["seed"] == config.get("seed", 0)
    assert ds.attrs["chance"] == pytest.approx(1 / n_c)


def test_binding_contact_sheet_and_logs_exist(workflow_run: Path) -> None:
    sheet = workflow_run / "results" / "datasets" / "binding_contact_sheet.png"
    assert sheet.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = (workflow_run / "logs" / "render_binding" / "binding.log").read_text()
    assert "rendered" in log
    assert (workflow_run / "logs" / "benchmarks" / "render_binding" / "binding.tsv").is_file()
