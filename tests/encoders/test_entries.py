"""Model entries: local weights files and the embeddings folder must exist; timm names are
checked against a cached architecture list (repdiag.encoders.entries)."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from repdiag.core.errors import ConfigError, EncoderError
from repdiag.encoders import entries
from repdiag.encoders.entries import (
    check_embeddings_config,
    check_model_files,
    check_safetensors,
    zoo_dir_of,
    zoo_files,
)

# a safetensors file with no tensors: its 8-byte header length, then the JSON header "{}"
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


def test_check_model_files_names_the_missing_file_or_hub_folder(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "hubconf.py").write_text("")
    (tmp_path / "w.safetensors").write_bytes(EMPTY_SAFETENSORS)
    models = {
        "ok_ckpt": {"source": "checkpoint", "id": "resnet18", "weights": "w.safetensors"},
        "ok_hub": {"source": "hub", "id": "r50", "repo": "hub", "weights": "w.safetensors"},
        "zoo": {"source": "zoo", "id": "mae"},
    }
    check_model_files({"models": models})
    bad = [
        ({"source": "checkpoint", "id": "r", "weights": "no.safetensors"}, "models.m.weights"),
        ({"source": "hub", "id": "r", "repo": "nohub"}, "models.m.repo"),
        (
            {"source": "hub", "id": "r", "repo": str(tmp_path)},
            r"models.m.repo: .* \(no .*hubconf.py\)",
        ),
        ({"source": "hub", "id": "r", "repo": "hub", "weights": "no.pth"}, "models.m.weights"),
        (
            {"source": "timm", "id": "resnet18", "pretrained": "no.safetensors"},
            "models.m.pretrained",
        ),
        ({"source": "open_clip", "id": "RN50", "pretrained": "w/no.bin"}, "models.m.pretrained"),
    ]
    for entry, message in bad:
        with pytest.raises(ConfigError, match=message):
            check_model_files({"models": {**models, "m": entry}})
        check_model_files({"models": {**models, "m": entry}}, models=["ok_ckpt", "zoo"])


@pytest.mark.parametrize(
    ("head", "refusal"),
    [
        (b"PK\x03\x04" + bytes(12), "is a pickle"),
        (b"\x80\x04" + bytes(14), "is a pickle"),  # protocol 4
        ((10**6).to_bytes(8, "little") + b'{"w": ', "is not a valid safetensors file"),
    ],
    ids=["torch.save zip", "raw pickle", "truncated header"],
)
def test_a_checkpoint_that_is_no_safetensors_file_is_refused_before_any_job(
    tmp_path: Path, head: bytes, refusal: str
) -> None:
    """The run's onstart check reads the checkpoint's first 16 bytes, never unpickles: a pickle
    named .safetensors stops the run before its first job, naming the model."""
    (tmp_path / "w.safetensors").write_bytes(head)
    (tmp_path / "hub.pth").write_bytes(head)  # a hub entry's weights may be a pickle (weights_only)
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "hubconf.py").write_text("")
    entries = {
        "evil": {"source": "checkpoint", "id": "r", "weights": str(tmp_path / "w.safetensors")},
        "hub": {
            "source": "hub",
            "id": "r",
            "repo": str(tmp_path / "hub"),
            "weights": str(tmp_path / "hub.pth"),
        },
    }
    check_model_files({"models": entries}, models=["hub"])
    with pytest.raises(EncoderError, match=rf"model 'evil': .*w.safetensors {refusal}"):
        check_model_files({"models": entries})


def test_a_checkpoint_that_is_a_device_or_a_pipe_is_refused_unread(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.safetensors")  # opening it for reading would block
    (tmp_path / "zero.safetensors").symlink_to("/dev/zero")  # reading it would never end
    for name in ("pipe.safetensors", "zero.safetensors"):
        entry = {"source": "checkpoint", "id": "r", "weights": str(tmp_path / name)}
        with pytest.raises(ConfigError, match=rf"models.m.weights: .*{name} is not a regular file"):
            check_model_files({"models": {"m": entry}})
        with pytest.raises(EncoderError, match=rf"model 'm': .*{name} is not a regular file"):
            check_safetensors(tmp_path / name, "m")  # the loader's own check, at the job


def test_embeddings_folder_must_exist(tmp_path: Path) -> None:
    check_embeddings_config({"embeddings": {"folder": None}})
    check_embeddings_config({"embeddings": {"folder": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"embeddings.folder: .*gone is not a folder"):
        check_embeddings_config({"embeddings": {"folder": str(tmp_path / "gone")}})


def test_timm_architectures_equal_timm_and_agree_with_is_model(tmp_path, monkeypatch) -> None:
    import timm

    monkeypatch.setenv(entries.CACHE_ENV, str(tmp_path / "cache"))
    assert entries.timm_architectures() == frozenset(timm.list_models())
    assert len(list((tmp_path / "cache").glob("timm-*.json"))) == 1  # written for the next parse
    for name in [
        "resnet18",
        "vit_base_patch16_224.augreg_in21k",
        "vit_tiny_patch16_2244",
        "resnet18.",
        "not_a_model",
    ]:
        assert entries.is_timm_architecture(name) == timm.is_model(name), name


def test_the_timm_cache_file_is_what_is_read(tmp_path, monkeypatch) -> None:
    """A planted list is believed (so no import of timm happens on a warm cache)."""
    monkeypatch.setenv(entries.CACHE_ENV, str(tmp_path))
    version = importlib.metadata.version("timm")
    (tmp_path / f"timm-{version}.json").write_text('["only_this_arch"]')
    assert entries.is_timm_architecture("only_this_arch.some_tag")
    assert not entries.is_timm_architecture("resnet18")


@pytest.mark.parametrize("content", ["{", "[]", '{"resnet18": 1}', "[1, 2]"])
def test_a_malformed_timm_cache_is_rebuilt(tmp_path, monkeypatch, content: str) -> None:
    import timm

    monkeypatch.setenv(entries.CACHE_ENV, str(tmp_path))
    path = tmp_path / f"timm-{importlib.metadata.version('timm')}.json"
    path.write_text(content)
    assert entries.timm_architectures() == frozenset(timm.list_models())
    assert json.loads(path.read_text()) == timm.list_models()


def test_an_unwritable_timm_cache_only_costs_the_import(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(entries.CACHE_ENV, str(blocker / "cache"))  # mkdir under a file fails
    assert entries.is_timm_architecture("resnet18")
    assert not entries.is_timm_architecture("resnet18x")


def test_a_jobs_zoo_folder_is_recovered_from_its_zoo_inputs() -> None:
    entry = {"source": "zoo", "id": "simclr_s0"}
    assert zoo_dir_of(zoo_files(entry, "elsewhere/zoo")) == Path("elsewhere/zoo")
    assert zoo_dir_of(zoo_files({"source": "timm", "name": "resnet18"})) == Path("results/zoo")
