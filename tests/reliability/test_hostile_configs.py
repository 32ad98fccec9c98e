"""Hostile but fair configs: path strings, parameter order, YAML size.

Every config string that becomes part of an output, log or store path is matched by an anchored
pattern (``\\A...\\Z``: ``$`` would accept a trailing newline) and refused at config time naming
the key; a config whose mappings are reordered plans the same jobs with the same params.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from repdiag.core.config import load_config
from repdiag.core.errors import ConfigError
from tests.conftest import REPO
from tests.reliability.memory import peak_growth_mib

SCHEMAS = REPO / "schemas"
# Patterns that are a search inside a longer string (a template must contain "{}"), not a
# whole-string pattern.
SEARCH_PATTERNS = {"\\{\\}"}
# String schema nodes whose value becomes part of a path (results/, logs/, store names), by the
# last key of their location; "propertyNames" are the keys of models, zoo runs and backbones.
PATH_KEYS = {"propertyNames", "layer", "layers", "a", "b", "probe_set", "image_sets"}


def _walk(node: Any, where: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, (*where, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*where, str(i)))


def _schema_nodes() -> Iterator[tuple[str, tuple[str, ...], dict]]:
    for path in sorted(SCHEMAS.glob("*.schema.yaml")):
        for where, node in _walk(yaml.safe_load(path.read_text()), ()):
            yield path.name, where, node


def _anchored(pattern: str) -> bool:
    return pattern.startswith("\\A") and pattern.endswith("\\Z")


def test_every_whole_string_pattern_is_anchored_with_A_and_Z() -> None:
    loose = [
        (name, "/".join(where), node["pattern"])
        for name, where, node in _schema_nodes()
        if isinstance(node.get("pattern"), str)
        and node["pattern"] not in SEARCH_PATTERNS
        and not _anchored(node["pattern"])
    ]
    assert not loose, (
        f"patterns not anchored with \\A...\\Z ($ accepts a trailing newline): {loose}"
    )


def test_every_string_that_feeds_a_path_has_an_anchored_pattern() -> None:
    found, missing = [], []
    for name, where, node in _schema_nodes():
        if not where:
            continue
        # the node itself (layer: {type: string}) or the items of an array (layers: [str])
        key = where[-1] if where[-1] not in ("items",) else where[-2]
        if key not in PATH_KEYS or (where[-2:-1] == ("properties",) and key == "items"):
            continue
        if where[-1] != "propertyNames" and node.get("type") != "string" and "pattern" not in node:
            continue
        found.append((name, "/".join(where)))
        if "enum" not in node and not _anchored(str(node.get("pattern", ""))):
            missing.append((name, "/".join(where)))
    assert len(found) >= 8, found  # models, zoo runs and backbones, pair a/b/layer, layer lists
    assert not missing, f"string properties that feed a path without an anchored pattern: {missing}"


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


BASE = yaml.safe_load((REPO / "config" / "test.yaml").read_text())


def _pair_config(**pair: str) -> dict:
    config = copy.deepcopy(BASE)
    a, b = list(config["models"])[:2]
    config["alignment"]["real"]["pairs"] = [{"a": a, "b": b, "layer": "final", **pair}]
    return config


@pytest.mark.parametrize(
    "config, key",
    [
        (_pair_config(layer="final/../../../../outside/escape"), r"\['layer'\]"),
        (_pair_config(layer="final\n"), r"\['layer'\]"),
        (_pair_config(layer="../final"), r"\['layer'\]"),
        (_pair_config(a="../../outside"), r"\['a'\]"),
        (
            {**BASE, "models": {"ab\n": next(iter(BASE["models"].values()))}},
            r"instance\['models'\]",
        ),
        (
            {**BASE, "models": {"a/../../b": next(iter(BASE["models"].values()))}},
            r"instance\['models'\]",
        ),
    ],
    ids=[
        "layer-traversal",
        "layer-newline",
        "layer-dotdot",
        "pair-a-traversal",
        "key-newline",
        "key-slash",
    ],
)
def test_path_strings_are_refused_at_config_time_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict, key: str
) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match=key):
        load_config(_write(tmp_path, config))
    assert not (tmp_path.parent / "outside").exists()


def test_a_python_target_with_a_trailing_newline_is_refused() -> None:
    from repdiag.encoders.entries import check_entry

    entry = {"source": "python", "id": "repdiag.binding.controls:occupancy\n", "family": "control"}
    with pytest.raises(ConfigError, match=r"models\.x\.id"):
        check_entry("x", entry, check_names=False)


def _reversed(value: Any) -> Any:
    """Every mapping with its keys in reverse order (lists keep their order: it is meaningful)."""
    if isinstance(value, dict):
        return {key: _reversed(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed(item) for item in value]
    return value


@pytest.mark.workflow
def test_a_config_with_every_mapping_reordered_reruns_nothing(tmp_path: Path) -> None:
    """Every job of the test config recorded as done (params included), then the same configs
    with the keys of every mapping in reverse order: nothing to be done, no changed params."""
    from tests.conftest import copy_workflow
    from tests.planning import mark_done, plan

    workdir = copy_workflow(tmp_path / "run")
    mark_done(workdir)
    assert plan(workdir) == []  # params are recorded: nothing to do before the reordering
    for name in ("config/config.yaml", "config/test.yaml"):
        path = workdir / name
        path.write_text(
            yaml.safe_dump(_reversed(yaml.safe_load(path.read_text())), sort_keys=False)
        )
    assert plan(workdir) == []  # a changed param would plan its job ("Params have changed")


# --- YAML size and schema messages (case 10) ----------------------------------------------------


def _alias_bomb(levels: int = 9) -> str:
    """~1 KB of YAML that expands to 10**levels leaves (the billion laughs)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines)


def _bomb_config(tmp_path: Path) -> Path:
    base = (REPO / "config" / "test.yaml").read_text()
    key = next(iter(BASE["models"]))
    config = copy.deepcopy(BASE)
    config["models"][key]["kwargs"] = {"payload": "BOMB"}
    text = yaml.safe_dump(config).replace("payload: BOMB", "payload: *a8")
    path = tmp_path / "bomb.yaml"
    path.write_text("_anchors:\n" + "\n".join("  " + line for line in _alias_bomb().splitlines())
                    + "\n" + text)  # fmt: skip
    assert len(path.read_bytes()) < len(base) + 4096
    return path


def test_a_yaml_alias_bomb_is_refused_before_validation(tmp_path: Path) -> None:
    import tracemalloc

    from repdiag.core.config import load_yaml

    path = _bomb_config(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(
            ConfigError, match=r"bomb\.yaml: \d+ aliases expanding to \d+ YAML nodes"
        ):
            load_yaml(path)
        with pytest.raises(ConfigError, match=r"aliases expanding"):
            load_config(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # refused on the composed graph: the 10**9 leaves are never built (a few MB, not gigabytes)
    assert peak < 50 * 2**20, peak


@pytest.mark.workflow
def test_a_yaml_alias_bomb_stops_a_dry_run_in_seconds(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import copy_workflow, snakemake_env

    workdir = copy_workflow(tmp_path / "run")
    path = _bomb_config(workdir / "config")
    exe = Path(__import__("sys").executable).with_name("snakemake")
    # timeout: a hang guard only (an expanded bomb would never finish); no speed is asserted
    proc = subprocess.run(
        [str(exe), "-n", "--cores", "1", f"--configfile={path}"],
        cwd=workdir, capture_output=True, text=True, timeout=120, env=snakemake_env(),
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "aliases expanding" in out, out[-3000:]
    assert len(out) < 20_000
    assert not (workdir / "results").exists()


def test_a_schema_error_prints_the_key_path_not_the_instance(tmp_path: Path) -> None:
    config = copy.deepcopy(BASE)
    key = next(iter(config["models"]))
    config["models"][key]["preprocess"] = {"mean": [[0.5] * 1000] * 100}  # 100k numbers, wrong type
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, config))
    message = str(err.value)
    assert f"models.{key}.preprocess.mean" in message and "instance['models']" in message
    assert "'type'" in message or "'maxItems'" in message
    assert len(message) < 1500, len(message)


def test_only_a_python_entry_runs_code_and_it_runs_the_named_callable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 11: `source: python` executes the callable it names, by design (documented in the
    README and tests/reliability/README.md); the same string under any other source is data."""
    from repdiag.core.errors import EncoderError
    from repdiag.encoders.factory import build_encoder

    marker = tmp_path / "ran.txt"
    (tmp_path / "marker_module.py").write_text(
        "import pathlib\n\n\ndef run(path):\n    pathlib.Path(path).write_text('ran')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for source in ("timm", "open_clip", "torchvision"):
        entry = {"source": source, "id": "marker_module:run", "family": "other"}
        with pytest.raises((EncoderError, ConfigError)):
            build_encoder("x", entry)
        assert not marker.exists(), source
    python = {"source": "python", "id": "marker_module:run", "family": "other"}
    with pytest.raises(EncoderError, match=r"returned NoneType, not an nn\.Module"):
        build_encoder("x", {**python, "kwargs": {"path": str(marker)}})
    assert marker.read_text() == "ran"  # it ran: a python entry is code, like the package it names


# --- Models checked as one thing, zoo meta.json and weights like config models ------------------


def _peak_rss_growth(action) -> int:
    """Bytes by which this process's resident memory peaked above its size before ``action()``
    (tests.reliability.memory: the peak is reset first, so an earlier test cannot hide it)."""
    return int(peak_growth_mib(action) * 2**20)


def _validate_error(tmp_path: Path, config: dict, capsys: pytest.CaptureFixture[str]) -> str:
    from repdiag.cli import main

    path = _write(tmp_path, config)
    assert main(["validate", "--no-weights", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repdiag: error: ") and err.count("\n") == 1, err
    return err


def test_numbers_each_under_their_cap_building_a_huge_backbone_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """embed_dim 16384 and depth 2 are each far under their caps (65536); together 4.3 G
    parameters: `repdiag validate` refuses the zoo run, measured on the meta device. (The
    reported 51.6 G case, depth 1000 at embed_dim 65536, is refused the same way; its meta build
    of 1000 blocks takes minutes on a busy machine, so it is not run here.)"""
    config = copy.deepcopy(BASE)
    backbone = next(iter(config["zoo"]["backbones"]))
    config["zoo"]["backbones"][backbone]["timm_kwargs"].update(
        {"embed_dim": 16384, "num_heads": 64, "depth": 2}
    )
    from repdiag.cli import main

    assert main(["validate", "--no-weights", str(_write(tmp_path, BASE))]) == 0  # imports warm
    capsys.readouterr()
    errors: list[str] = []
    growth = _peak_rss_growth(lambda: errors.append(_validate_error(tmp_path, config, capsys)))
    assert "4.3 G parameters, above the cap of 2.0 G" in errors[0], errors
    assert "zoo.backbones" in errors[0]
    assert growth < 500 * 2**20, growth  # nothing of the 17 GB model allocated


def test_a_config_model_with_a_huge_activation_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = copy.deepcopy(BASE)
    config["models"]["wide"] = {
        "source": "timm",
        "id": "vit_small_patch16_224",
        "family": "supervised",
        "kwargs": {"img_size": 2048, "patch_size": 4},
    }
    err = _validate_error(tmp_path, config, capsys)
    assert "model 'wide': models.wide: one 2048 px image makes" in err and "GiB" in err


def _zoo_run(tmp_path: Path, meta_edit=None, tensor_edit=None) -> Path:
    """A tiny zoo run folder written as train_zoo writes it, then edited like a hostile user."""
    import json

    import timm
    from safetensors.torch import save_file

    from repdiag.encoders.zoo.checkpoint import file_sha256

    kwargs = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs)
    tensors = {k: v.contiguous().clone() for k, v in backbone.state_dict().items()}
    if tensor_edit:
        tensor_edit(tensors)
    run = tmp_path / "zoo" / "run"
    run.mkdir(parents=True)
    save_file(tensors, str(run / "model.safetensors"))
    meta = {
        "objective": "simclr",
        "family": "contrastive",
        "timm_model": "vit_tiny_patch16_224",
        "timm_kwargs": kwargs,
        "pooling": "cls",
        "preprocess": {"input_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3},
        "head": None,
        "weights_sha256": file_sha256(run / "model.safetensors"),
    }
    if meta_edit:
        meta_edit(meta)
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def _refused_load(run: Path) -> tuple[str, int]:
    """The EncoderError message of loading the zoo run ``run`` and the peak resident growth in
    bytes while it was refused."""
    from repdiag.core.errors import EncoderError
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    errors: list[str] = []

    def load() -> None:
        with pytest.raises(EncoderError) as err:
            load_zoo_model(run, "cpu")
        errors.append(str(err.value))

    growth = _peak_rss_growth(load)
    return errors[0], growth


def test_a_zoo_meta_json_goes_through_the_config_caps(tmp_path: Path) -> None:
    from repdiag.core.errors import EncoderError
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    assert load_zoo_model(_zoo_run(tmp_path / "ok"), "cpu").meta["timm_model"]  # the control loads
    load_zoo_model(_zoo_run(tmp_path / "ok2"), "cpu")  # and, loaded twice, sets this process's peak

    def huge(meta: dict) -> None:
        meta["timm_kwargs"].update({"img_size": 4096, "patch_size": 1})

    run = _zoo_run(tmp_path / "huge", meta_edit=huge)
    error, growth = _refused_load(run)
    assert str(run / "meta.json") in error and "above the cap" in error, error
    assert growth < 500 * 2**20, growth  # refused on the meta device, before the 3 GB build

    def over_cap(meta: dict) -> None:
        meta["preprocess"]["input_size"] = 10**6

    with pytest.raises(EncoderError, match=r"preprocess\.input_size: 1000000 is above the cap"):
        load_zoo_model(_zoo_run(tmp_path / "cap", meta_edit=over_cap), "cpu")

    def loads_weights(meta: dict) -> None:
        meta["timm_kwargs"]["pretrained_cfg_overlay"] = {"file": "/etc/passwd"}

    with pytest.raises(EncoderError, match=r"timm_kwargs\.pretrained_cfg_overlay"):
        load_zoo_model(_zoo_run(tmp_path / "kw", meta_edit=loads_weights), "cpu")


def test_a_zoo_head_wider_than_its_weights_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """Issue 60, class 1: meta.json's head of widths [32, 25000, 25000, 32] over a file with no
    head allocated 3.2 GB before the strict load failed; the shapes are compared on the meta
    device first."""
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    load_zoo_model(_zoo_run(tmp_path / "ok"), "cpu")  # sets this process's peak for the control

    def wide_head(meta: dict) -> None:
        meta["head"] = {"type": "mlp", "dims": [32, 25000, 25000, 32]}

    run = _zoo_run(tmp_path / "wide", meta_edit=wide_head)
    error, growth = _refused_load(run)
    assert "does not hold the architecture" in error and "(file: absent)" in error, error
    assert "head." in error and str(run / "meta.json") in error
    assert growth < 200 * 2**20, growth  # nothing of the 2.5 GB head allocated


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_zoo_weights_go_through_check_weights(tmp_path: Path, dtype: str) -> None:
    import torch

    from repdiag.core.errors import EncoderError
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    def edit(tensors: dict) -> None:
        tensors["cls_token"] = tensors["cls_token"].to(getattr(torch, dtype))

    with pytest.raises(EncoderError, match=rf"tensor 'cls_token' has dtype (torch\.)?{dtype}"):
        load_zoo_model(_zoo_run(tmp_path, tensor_edit=edit), "cpu")


def test_float8_weights_are_a_named_error(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from repdiag.core.errors import EncoderError
    from repdiag.encoders.weights import load_safetensors

    path = tmp_path / "w.safetensors"
    save_file({"fc.weight": torch.ones(2, 2).to(torch.float8_e4m3fn)}, str(path))
    with pytest.raises(EncoderError) as err:
        load_safetensors(path, "eight")
    message = str(err.value)
    assert "model 'eight'" in message and str(path) in message and "'fc.weight'" in message
    assert "float8_e4m3fn" in message
