from __future__ import annotations

import numpy as np
import xarray as xr

from repdiag.core.cli import main
from repdiag.core.store import write_store


def test_inspect_prints_dimensions_coordinates_arrays_and_provenance(tmp_path, capsys):
    ds = xr.Dataset(
        {"emb_final": (("image", "dim_final"), np.arange(12, dtype=np.float32).reshape(3, 4))},
        coords={"image": np.array(["query/a", "query/b", "query/c"], dtype=object)},
    )
    path = write_store(tmp_path / "m.zarr", ds, config={"batch_size": 8}, seed=3)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "image: 3" in out and "dim_final: 4" in out
    assert "query/a, query/b, query/c" in out
    assert "emb_final" in out and "min 0  mean 5.5  max 11" in out
    assert '"batch_size": 8' in out and "seed: 3" in out


def test_inspect_of_a_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "gone.zarr")]) == 2
    assert "gone.zarr does not exist" in capsys.readouterr().err


def test_validate_reports_the_bad_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: {}\nmodels: {m: {source: zoo, id: x, family: nope}}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "family" in err and "nope" in err


def test_plan_of_the_embedded_default_lists_every_zoo_model_and_the_totals(capsys):
    """config.yaml: 48 zoo runs (17 + the 15 of the dose series + the 16 JER-regularised runs of
    binding_causal), built from their specs (no checkpoint needed), and 7 controls."""
    import re

    from repdiag.binding import plan as planner
    from repdiag.core.config import load_config

    assert main(["plan", "config.yaml", "--rate", "1e12", "--totals"]) == 0
    out = capsys.readouterr().out
    config = load_config("config.yaml")
    zoo = [key for key, entry in config["models"].items() if entry["source"] == "zoo"]
    assert len(zoo) == 48
    for key in zoo:
        assert f"{key}: zoo run {key} (from its spec)" in out
    # 16 + 8 probe images; a zoo ResNet tap's d_out VJPs: 32 + 64 + 128 + 256 (auto: all exact)
    assert "probe images" in out and " 24 probe images" in out
    assert "480 products" in out
    total = re.search(r"grand total: (\d+) models x 24 probe images: ([\d.]+) (\w)FLOP", out)
    assert total is not None
    planned = int(total.group(1))
    assert planned == len(config["models"]) - out.count("not planned: ")
    assert "at 1 TFLOP/s (given)" in out
    # the printed total is the planner's, for the embedded default's models
    plan = planner.plan_config(config, rate=1e12, models=zoo[:1])
    assert plan.settings["images"] == 24 and plan.settings["batch_size"] == 32  # null: CPU default


def test_plan_options_reach_the_planner_and_bad_models_are_an_error(capsys):
    assert main(["plan", "--rate", "2e12", "config.yaml", "--models", "vicreg_s0"]) == 0
    out = capsys.readouterr().out
    assert "vicreg_s0: zoo run vicreg_s0" in out and "stage3" in out and "GFLOP/image" in out
    assert "grand total: 1 models x 24 probe images" in out and "at 2 TFLOP/s" in out
    assert main(["plan", "config.yaml", "--models", "nope"]) == 2
    assert "unknown models ['nope']" in capsys.readouterr().err
