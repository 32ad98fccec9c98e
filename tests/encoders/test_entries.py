"""Model entries: local weights files and the embeddings folder must exist (repdiag.encoders.entries)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.core.errors import ConfigError
from repdiag.encoders.entries import check_embeddings_config, check_model_files


def test_check_model_files_names_the_missing_file_or_hub_folder(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "hubconf.py").write_text("")
    (tmp_path / "w.safetensors").write_bytes(b"")
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


def test_embeddings_folder_must_exist(tmp_path: Path) -> None:
    check_embeddings_config({"embeddings": {"folder": None}})
    check_embeddings_config({"embeddings": {"folder": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"embeddings.folder: .*gone is not a folder"):
        check_embeddings_config({"embeddings": {"folder": str(tmp_path / "gone")}})
