from __future__ import annotations

import numpy as np
import xarray as xr

from repdiag.cli import main
from repdiag.core.store import write_store
from tests.planning import tiny_config


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


def _test_config_with(tmp_path, **models) -> str:
    import yaml

    config = yaml.safe_load(open("config/test.yaml"))
    config["models"].update(models)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_validate_checks_weights_caches_unless_told_not_to(tmp_path, capsys, monkeypatch):
    """Issue 36, case 14: an uncached `pretrained: true` is refused naming the model and the
    caches to fill; --no-weights checks the rest (a config whose weights live elsewhere)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    entry = {"source": "timm", "id": "resnet18", "family": "supervised", "pretrained": True}
    path = _test_config_with(tmp_path, pre=entry)
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert (
        f"repdiag: error: {path}: model 'pre': pretrained weights of timm model 'resnet18' are "
        f"not in the local Hugging Face cache {tmp_path / 'hf'} (timm/resnet18.a1_in1k) or the "
        f"torch.hub cache {tmp_path / 'torch' / 'hub' / 'checkpoints'}"
    ) in err
    assert "`repdiag validate --no-weights` checks everything else" in err
    assert main(["validate", "--no-weights", path]) == 0
    n_models = len(tiny_config()["models"])  # config/test.yaml's, plus the one added
    assert f"valid ({n_models + 1} models; weights not checked: --no-weights)" in (
        capsys.readouterr().out
    )
    ckpt = {
        "source": "checkpoint",
        "id": "resnet18",
        "family": "supervised",
        "weights": "w.safetensors",
    }
    assert main(["validate", _test_config_with(tmp_path, ckpt=ckpt)]) == 2
    assert (
        "models.ckpt.weights: the weights file w.safetensors does not exist"
        in capsys.readouterr().err
    )
    assert main(["validate", "config/test.yaml"]) == 0
    assert f"valid ({n_models} models; weights checked)" in capsys.readouterr().out


def test_validate_builds_zoo_backbones_even_without_weights(tmp_path, capsys):
    import yaml

    config = yaml.safe_load(open("config/test.yaml"))
    config["zoo"]["backbones"]["vit"]["timm_kwargs"]["num_heads"] = 3  # 32 wide: no split
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["validate", "--no-weights", str(path)]) == 2
    err = capsys.readouterr().err
    assert "zoo.backbones.vit.timm_kwargs: timm cannot build 'vit_tiny_patch16_224'" in err
    assert "--no-weights` checks" not in err  # not a weights error: no hint


def test_validate_help_documents_no_weights(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--no-weights" in out and "weights live on another machine" in out


def test_plan_of_the_embedded_default_lists_every_zoo_model_and_the_totals(capsys):
    """config/config.yaml: 165 zoo runs (17 + the 16 of the dose series and its trajectory + the 60
    runs of binding_causal's six arms x 10 seeds + the 16 of the dose series' replicate + the 28
    of binding_families, 21 ResNet and 7 ViT, each with its step-1000 checkpoint), built from their
    specs (no checkpoint needed), and 7 controls."""
    import re

    from repdiag.core.config import load_config
    from repdiag.encoders.jacobian import plan_project as planner

    assert main(["plan", "config/config.yaml", "--rate", "1e12", "--totals"]) == 0
    out = capsys.readouterr().out
    config = load_config("config/config.yaml")
    zoo = [key for key, entry in config["models"].items() if entry["source"] == "zoo"]
    assert len(zoo) == 165
    for key in zoo:  # a saved step's model names its run (dose_1_s0-step100)
        assert f"{key}: zoo run {config['models'][key]['id']} (from its spec)" in out
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
    assert main(["plan", "--rate", "2e12", "config/config.yaml", "--models", "vicreg_s0"]) == 0
    out = capsys.readouterr().out
    assert "vicreg_s0: zoo run vicreg_s0" in out and "stage3" in out and "GFLOP/image" in out
    assert "grand total: 1 models x 24 probe images" in out and "at 2 TFLOP/s" in out
    assert main(["plan", "config/config.yaml", "--models", "nope"]) == 2
    assert "unknown models ['nope']" in capsys.readouterr().err


def test_run_names_the_config_files_snakemake_would_read():
    from repdiag.cli import config_files_of

    assert config_files_of(["--cores", "2", "binding"]) == ["config/config.yaml"]
    assert config_files_of(["--configfile", "a.yaml", "b.yaml", "-n", "binding"]) == [
        "a.yaml", "b.yaml",
    ]  # fmt: skip
    assert config_files_of(["--configfile=a.yaml", "--configfiles", "b.yaml"]) == [
        "a.yaml",
        "b.yaml",
    ]


def test_run_refuses_an_alias_bomb_before_snakemake_expands_it(tmp_path, monkeypatch, capsys):
    """Snakemake expands a config's aliases while merging it (a 5 KB file took 5.7 GB): `repdiag
    run` reads each file with repdiag's capped reader first and starts Snakemake only if all pass."""
    import os
    import tracemalloc

    started = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: started.append(argv))
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nseed: *a8\n")
    tracemalloc.start()
    assert main(["run", "--cores", "1", "--configfile", str(bomb), "binding"]) == 2
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "bomb.yaml" in capsys.readouterr().err and started == []
    assert peak < 50e6  # refused from its structure, never expanded
    good = tmp_path / "good.yaml"
    good.write_text("seed: 1\n")
    assert main(["run", "--configfile", str(good), "-n"]) == 0  # execv stood in for
    assert started and started[0][1:] == ["--configfile", str(good), "-n"]
