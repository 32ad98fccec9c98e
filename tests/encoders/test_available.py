"""The weights checks of a run's start: library-cache weights named by an entry are cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.encoders.available import check_weights_available

CACHED = {
    "tag": {"source": "open_clip", "id": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"},
    "enum": {"source": "torchvision", "id": "resnet18", "pretrained": "IMAGENET1K_V1"},
    "hf": {"source": "timm", "id": "resnet18.a1_in1k", "pretrained": True},
}


def _fake_hf_file(cache: Path, repo_id: str, filename: str) -> None:
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / ("0" * 40) / filename).write_bytes(b"")


def test_uncached_library_weights_fail_before_the_first_job(tmp_path: Path, monkeypatch) -> None:
    """pretrained: true (timm), a tag (open_clip), an enum (torchvision): checked in the caches."""
    import huggingface_hub.constants
    import open_clip
    import torchvision
    from timm.models import get_pretrained_cfg

    from repdiag.core.errors import EncoderError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    for key, entry in CACHED.items():
        with pytest.raises(EncoderError, match=rf"model '{key}': .*not in the .*cache"):
            check_weights_available({"models": {key: entry}})
        check_weights_available({"models": {key: entry}}, models=[])  # only models with jobs
    _fake_hf_file(
        tmp_path / "hf",
        open_clip.get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")["hf_hub"].strip("/"),
        "open_clip_model.safetensors",
    )
    _fake_hf_file(
        tmp_path / "hf", get_pretrained_cfg("resnet18.a1_in1k").hf_hub_id, "model.safetensors"
    )
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    hub = tmp_path / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / Path(weights.url).name).write_bytes(b"")
    check_weights_available({"models": CACHED})


def test_weights_files_are_checked_without_importing_torch() -> None:
    """A run's start pays for torch only where an entry names library-cache weights."""
    import subprocess
    import sys

    code = (
        "import sys; from repdiag.studies import register; register(); "
        "from repdiag.core.config import load_config; "
        "from repdiag.encoders.available import check_weights_available; "
        "check_weights_available(load_config('config/config.yaml')); print('torch' in sys.modules)"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
