"""Untrusted files never run code, and config strings never reach a shell.

Every weights file a config can name, and the CIFAR-10 pickle batches, is tried with a payload
whose unpickling would create a marker directory: each is refused (or read without unpickling
code), with a message naming the entry, and the marker never appears. The payload itself is live:
a plain ``torch.load(weights_only=False)`` does create the marker.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torch
import yaml

from repdiag.core.errors import EncoderError, StoreError
from repdiag.encoders.factory import build_encoder
from tests.conftest import REPO, copy_workflow, snakemake


class Payload:
    """Unpickling this object calls ``os.mkdir(marker)``: harmless proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def torch_save_payload(path: Path, marker: Path) -> Path:
    torch.save({"weight": torch.zeros(2), "extra": Payload(marker)}, path)
    return path


def raw_pickle_payload(path: Path, marker: Path) -> Path:
    path.write_bytes(pickle.dumps({"weight": Payload(marker)}, protocol=4))
    return path


def hub_repo(root: Path) -> Path:
    repo = root / "hub"
    repo.mkdir()
    (repo / "hubconf.py").write_text(
        "import torch\n\n"
        "def tiny(pretrained=False):\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1))\n"
    )
    return repo


def zoo_dir(root: Path, weights: Path) -> Path:
    run = root / "zoo" / "evil"
    run.mkdir(parents=True)
    (run / "meta.json").write_text("{}")
    os.replace(weights, run / "model.safetensors")
    return root / "zoo"


# entry of models.<key> given the payload file -> (entry, zoo_dir or None)
ENTRIES = {
    "checkpoint, .safetensors name": lambda f, tmp: {
        "source": "checkpoint",
        "id": "resnet18",
        "family": "other",
        "weights": str(f("model.safetensors")),
    },
    "checkpoint, .pt name": lambda f, tmp: {
        "source": "checkpoint",
        "id": "resnet18",
        "family": "other",
        "weights": str(f("model.pt")),
    },
    "zoo checkpoint": lambda f, tmp: {
        "source": "zoo",
        "id": "evil",
        "family": "other",
        "_zoo_dir": str(zoo_dir(tmp, f("payload"))),
    },
    "hub weights": lambda f, tmp: {
        "source": "hub",
        "id": "tiny",
        "family": "other",
        "repo": str(hub_repo(tmp)),
        "weights": str(f("hub.pth")),
    },
    "timm pretrained file": lambda f, tmp: {
        "source": "timm",
        "id": "resnet18",
        "family": "supervised",
        "pretrained": str(f("timm.pth")),
    },
    "torchvision pretrained file": lambda f, tmp: {
        "source": "torchvision",
        "id": "resnet18",
        "family": "supervised",
        "pretrained": str(f("tv.pth")),
    },
    "open_clip pretrained file": lambda f, tmp: {
        "source": "open_clip",
        "id": "RN50",
        "family": "vision_language",
        "pretrained": str(f("clip.pt")),
    },
}
WRITERS = {"torch.save archive": torch_save_payload, "raw pickle": raw_pickle_payload}


def test_the_payload_runs_code_when_unpickled_without_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    torch.load(torch_save_payload(tmp_path / "a.pth", marker), weights_only=False)
    assert marker.is_dir()
    marker.rmdir()
    pickle.loads(raw_pickle_payload(tmp_path / "b.pkl", marker).read_bytes())
    assert marker.is_dir()


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("case", list(ENTRIES))
def test_weights_files_that_would_run_code_are_refused(
    tmp_path: Path, case: str, writer: str
) -> None:
    marker = tmp_path / "marker"
    entry = ENTRIES[case](lambda name: WRITERS[writer](tmp_path / name, marker), tmp_path)
    zoo = entry.pop("_zoo_dir", tmp_path / "no-zoo")
    with pytest.raises(EncoderError, match=r"model 'evil'") as err:
        build_encoder("evil", entry, zoo_dir=zoo)
    assert re.search(r"pickle|weights_only|Unsupported global|not a valid", str(err.value))
    assert not marker.exists(), f"{case}: unpickling ran the payload"


def test_cifar_batches_are_unpickled_with_numpy_globals_only(tmp_path: Path) -> None:
    from repdiag.cifar.data import read_pickle_batch

    marker = tmp_path / "marker"
    batch = raw_pickle_payload(tmp_path / "data_batch_1", marker)
    with pytest.raises(StoreError, match=r"data_batch_1.*posix|data_batch_1.*mkdir"):
        read_pickle_batch(batch)
    assert not marker.exists()


def test_a_workflow_run_refuses_the_payload_naming_the_model(tmp_path: Path) -> None:
    """Refused by the run's onstart check, before its first job (the extraction job's own
    refusal, were the file swapped after the start, is load_safetensors': tests/encoders)."""
    workdir = copy_workflow(tmp_path / "run")
    marker = tmp_path / "marker"
    weights = torch_save_payload(tmp_path / "model.safetensors", marker)
    config = yaml.safe_load((workdir / "config" / "test.yaml").read_text())
    config["models"] = {
        "evil": {
            "source": "checkpoint",
            "id": "resnet18",
            "family": "other",
            "weights": str(weights),
        }
    }
    config["alignment"]["real"]["pairs"] = []
    config["binding_causal"] = {"series": []}
    (workdir / "config" / "evil.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(
        workdir, "--configfile=config/evil.yaml", "results/embeddings/evil.zarr", check=False
    )
    logs = "".join(p.read_text() for p in (workdir / "logs").rglob("*.log"))
    output = proc.stdout + proc.stderr + logs
    assert proc.returncode != 0
    assert "model 'evil'" in output and "is a pickle" in output, output[-3000:]
    assert not marker.exists()
    assert not (workdir / "results").exists()  # no job ran, not even the dataset's


def test_no_rule_passes_config_strings_to_a_shell() -> None:
    """Every rule runs a ``script:``; ``shell:``/``run:`` would be the way config strings reach
    a shell (the schema also restricts model keys to ``[A-Za-z0-9_.-]``)."""
    sources = [REPO / "Snakefile", *sorted((REPO / "rules").rglob("*.smk"))]
    rules = {}
    for source in sources:
        text = source.read_text()
        assert not re.search(r"^\s+(shell|run):", text, re.MULTILINE), source
        assert "os.system" not in text and "subprocess" not in text, source
        for body in re.split(r"^(?=rule \w+:)", text, flags=re.MULTILINE)[1:]:
            rules[body.split(":")[0]] = body
    assert len(rules) > 20
    for rule, body in rules.items():  # targets only (rule all, rule cifar) have no action
        assert "    script:" in body or "    output:" not in body, rule


# Keywords that would make a library open, unpickle or download a file itself (reliability README, hostile configs case 1),
# each given the payload in several path forms; nested forms for the factories that take dicts.
WEIGHTS_KWARGS = [
    "weights_only",
    "pretrained",
    "pretrained_cfg",
    "pretrained_cfg_overlay",
    "checkpoint_path",
    "cache_dir",
    "pretrained_image_path",
    "pretrained_text_path",
    "weights",
    "state_dict",
    "file",
    "load_weights",
    "jit",
]
KWARG_SOURCES = {
    "timm": {"source": "timm", "id": "resnet18", "family": "supervised"},
    "open_clip": {"source": "open_clip", "id": "RN50", "family": "vision_language"},
    "torchvision": {"source": "torchvision", "id": "resnet18", "family": "supervised"},
    "checkpoint": {"source": "checkpoint", "id": "resnet18", "family": "other"},
    "hub": {"source": "hub", "id": "tiny", "family": "other"},
}


def _kwarg_value(keyword: str, form: str, path: Path):
    if keyword == "weights_only":
        return False
    if keyword in ("jit", "load_weights"):
        return True
    return {
        "absolute": str(path),
        "relative": os.path.relpath(path),
        "nested": {"file": str(path)},
    }[form]


@pytest.mark.parametrize("form", ["absolute", "relative", "nested"])
@pytest.mark.parametrize("keyword", WEIGHTS_KWARGS)
@pytest.mark.parametrize("source", list(KWARG_SOURCES))
def test_kwargs_that_reach_a_library_loader_are_refused_naming_the_key(
    tmp_path: Path, source: str, keyword: str, form: str
) -> None:
    from repdiag.core.errors import ConfigError
    from repdiag.encoders.entries import check_entry

    marker = tmp_path / "marker"
    payload = torch_save_payload(tmp_path / "evil.pt", marker)
    entry = dict(KWARG_SOURCES[source], kwargs={keyword: _kwarg_value(keyword, form, payload)})
    if source == "checkpoint":
        entry["weights"] = str(tmp_path / "missing.safetensors")
    if source == "hub":
        entry["repo"] = str(hub_repo(tmp_path))
    with pytest.raises(ConfigError, match=rf"models\.evil\.kwargs\.{keyword}"):
        check_entry("evil", entry, check_names=False)
    with pytest.raises(EncoderError, match=rf"model 'evil'.*models\.evil\.kwargs\.{keyword}"):
        build_encoder("evil", entry, zoo_dir=tmp_path / "no-zoo")
    assert not marker.exists()


def test_nested_open_clip_tower_switches_are_refused(tmp_path: Path) -> None:
    entry = dict(KWARG_SOURCES["open_clip"], kwargs={"vision_cfg": {"timm_model_pretrained": True}})
    with pytest.raises(EncoderError, match=r"models\.evil\.kwargs\.vision_cfg"):
        build_encoder("evil", entry)
    entry = dict(KWARG_SOURCES["timm"], kwargs={"pretrained_cfg_overlay": {"file": "x.pth"}})
    with pytest.raises(EncoderError, match=r"models\.evil\.kwargs\.pretrained_cfg_overlay"):
        build_encoder("evil", entry)


def test_the_issue_open_clip_weights_only_case_never_unpickles(tmp_path: Path) -> None:
    """`pretrained: evil.pt, kwargs: {weights_only: false}` ran the payload before the fix."""
    marker = tmp_path / "marker"
    payload = torch_save_payload(tmp_path / "evil.pt", marker)
    entry = dict(KWARG_SOURCES["open_clip"], pretrained=str(payload))
    for kwargs in ({"weights_only": False}, {}):
        with pytest.raises(EncoderError, match=r"model 'evil'"):
            build_encoder("evil", dict(entry, kwargs=kwargs))
        assert not marker.exists()


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_files_are_read_by_the_project_loader(tmp_path: Path, suffix: str) -> None:
    """timm and open_clip get a state dict, never the path: the library opens nothing itself."""
    from unittest import mock

    import open_clip
    import timm
    from safetensors.torch import save_file

    net = timm.create_model("resnet18", pretrained=False)
    clip = open_clip.create_model("RN50")
    cases = [
        ("timm", net.state_dict(), net.state_dict()),
        ("open_clip", clip.state_dict(), clip.visual.state_dict()),
    ]
    for source, state, expected in cases:
        path = tmp_path / f"{source}{suffix}"
        if suffix == ".safetensors":
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        else:
            torch.save(state, path)
        opened: list = []

        def spy(f, *args, _opened=opened, _load=torch.load, **kwargs):
            _opened.append((f, kwargs.get("weights_only")))
            return _load(f, *args, **kwargs)

        with mock.patch("torch.load", spy):
            encoder = build_encoder("m", dict(KWARG_SOURCES[source], pretrained=str(path)))
        assert all(weights_only is True for _, weights_only in opened), opened
        got = encoder.model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in expected.items() if k in got)
