"""Offline is enforced: HF_HUB_OFFLINE=0 in the environment does not win, and torch.hub, timm
and open_clip downloads are refused naming the URL (repdiag.core.offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.core.errors import EncoderError
from repdiag.core.offline import DOWNLOADERS, OFFLINE_ENV, enforce_offline


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A user environment that asks for the network; everything restored after the test."""
    import importlib

    import huggingface_hub.constants

    for name in OFFLINE_ENV:
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for module_name, function in DOWNLOADERS:
        module = importlib.import_module(module_name)
        monkeypatch.setattr(module, function, getattr(module, function))
    return monkeypatch


def test_offline_wins_over_the_environment(online: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub
    import torch.hub

    enforce_offline()
    import os

    assert {name: os.environ[name] for name in OFFLINE_ENV} == OFFLINE_ENV
    assert huggingface_hub.constants.is_offline_mode()
    with pytest.raises(Exception) as err:
        huggingface_hub.hf_hub_download(
            "timm/resnet18.a1_in1k", "model.safetensors", cache_dir=tmp_path
        )
    chain, cause = [], err.value
    while cause is not None:
        chain.append(type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    assert "OfflineModeIsEnabled" in chain, chain  # refused before any request, not a failed one
    with pytest.raises(EncoderError, match=r"refusing to download http://127\.0\.0\.1:9/w\.pth"):
        torch.hub.load_state_dict_from_url("http://127.0.0.1:9/w.pth", model_dir=str(tmp_path))
    import open_clip.pretrained
    import timm.models._hub

    for module in (timm.models._hub, open_clip.pretrained):
        with pytest.raises(EncoderError, match="refusing to download"):
            getattr(module, dict(DOWNLOADERS)[module.__name__])("http://127.0.0.1:9/w.bin")
    assert not any(tmp_path.iterdir())  # nothing fetched, nothing written


def test_building_an_encoder_enforces_offline(online: pytest.MonkeyPatch) -> None:
    import os

    import timm.models._hub

    from repdiag.core.offline import refuse_download
    from repdiag.encoders.factory import build_encoder

    entry = {"source": "timm", "id": "resnet10t", "family": "supervised", "pooling": "mean"}
    build_encoder("tiny", entry, meta=True)
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # stays set after the build: the job's whole life
    assert timm.models._hub.download_url_to_file is refuse_download


@pytest.mark.workflow
def test_the_workflow_sets_offline_for_its_jobs(online: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    from tests.conftest import copy_workflow, plan_in_process

    workdir = copy_workflow(tmp_path / "run")
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    assert plan_in_process(workdir, workdir / "config" / "test.yaml") is None
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # jobs inherit the parsing process's environment
