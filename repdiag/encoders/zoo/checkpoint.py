"""Zoo checkpoints: ``model.safetensors`` (never pickle) + ``meta.json`` + ``curve.csv``.

``model.safetensors`` holds the timm backbone's ``state_dict()`` under its own keys and the
projection head's under ``head.*``; ``meta.json`` holds what rebuilds both
(``timm.create_model(meta["timm_model"], **meta["timm_kwargs"])`` and ``meta["head"]``).
Every file is written atomically; a missing, truncated or mismatched file is an
:class:`~repdiag.core.errors.EncoderError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save_file
from torch import nn

from repdiag.core.errors import EncoderError, StoreError
from repdiag.core.store import atomic_path, read_json, write_json, write_text
from repdiag.encoders.weights import check_float_slots, check_weights
from repdiag.encoders.zoo.backbones import build_backbone
from repdiag.encoders.zoo.heads import MLPHead, build_head

HEAD_PREFIX = "head."
META_KEYS = ("objective", "family", "timm_model", "timm_kwargs", "pooling", "preprocess", "head")

PathLike = str | os.PathLike[str]


@dataclass
class ZooModel:
    """A rebuilt zoo encoder: backbone and head in eval mode, and the run's meta.json."""

    backbone: nn.Module
    head: MLPHead | None
    meta: dict[str, Any]


def checkpoint_tensors(backbone: nn.Module, head: nn.Module | None) -> dict[str, torch.Tensor]:
    """Backbone state under its own keys, head state under ``head.*`` (contiguous CPU copies)."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in backbone.state_dict().items()}
    if head is not None:
        for key, value in head.state_dict().items():
            name = HEAD_PREFIX + key
            if name in tensors:
                raise EncoderError(
                    f"head key {name!r} collides with a backbone key of the same name"
                )
            tensors[name] = value.detach().cpu().contiguous().clone()
    return tensors


def save_push(push: dict[str, torch.Tensor], path: PathLike) -> None:
    """A regularised run's cumulative push P (repdiag.encoders.zoo.regulariser), one tensor per
    backbone parameter under its state_dict name, atomically."""
    with atomic_path(path) as tmp:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in push.items()},
            str(tmp),
            metadata={"format": "pt", "content": "cumulative push"},
        )


def curve_text(losses: list[float]) -> str:
    """``curve.csv``: ``step,loss`` per line (loss with full float precision)."""
    lines = ["step,loss", *(f"{step},{loss!r}" for step, loss in enumerate(losses))]
    return "\n".join(lines) + "\n"


def write_curve(path: PathLike, losses: list[float]) -> None:
    """:func:`curve_text` written atomically."""
    write_text(path, curve_text(losses))


def save_zoo_run(
    backbone: nn.Module,
    head: nn.Module | None,
    meta: dict[str, Any],
    losses: list[float],
    model_path: PathLike,
    meta_path: PathLike,
    curve_path: PathLike,
) -> None:
    """Write the three files of a run, each atomically (weights first, meta.json last).

    ``meta.json`` records the SHA-256 of the weights file (``weights_sha256``), so weights and
    meta of different runs (a write that failed between the two) are never loaded together.
    """
    with atomic_path(model_path) as tmp:
        save_file(checkpoint_tensors(backbone, head), str(tmp), metadata={"format": "pt"})
        digest = file_sha256(tmp)
    write_curve(curve_path, losses)
    write_json(meta_path, {**meta, "weights_sha256": digest})


def save_saved_steps(saved: Mapping[int, Any], path: PathLike) -> str:
    """Each saved step (a :class:`~repdiag.encoders.zoo.train.TrainResult`) in one safetensors
    file, atomically: its tensors under ``step<t>/``, its meta.json and curve.csv as text in the
    file's metadata (one file: a declared output that ``snakemake --touch`` and a killed job
    handle like any other). Returns the file's SHA-256, which the run's meta.json records."""
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"format": "pt", "content": "saved steps", "steps": json.dumps(sorted(saved))}
    for step, result in sorted(saved.items()):
        for name, value in checkpoint_tensors(result.backbone, result.head).items():
            tensors[f"step{step}/{name}"] = value
        metadata[f"step{step}/meta.json"] = json.dumps(result.meta)
        metadata[f"step{step}/curve.csv"] = curve_text(result.losses)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        return file_sha256(tmp)


def copy_saved_step(
    bundle: PathLike, step: int, run_meta: PathLike, out: Mapping[str, PathLike]
) -> None:
    """Step ``step`` of a run's saved steps (:func:`save_saved_steps`) written as the three files
    of a run, ``out["model"]``, ``out["curve"]``, ``out["meta"]`` (last, with the weights'
    SHA-256): the bundle is refused unless it is the one the run's ``run_meta`` recorded."""
    bundle = Path(bundle)
    recorded = read_json(run_meta).get("saved_sha256")
    tensors, metadata = _read_tensors_and_metadata(bundle, recorded)
    prefix = f"step{int(step)}/"
    if f"{prefix}meta.json" not in metadata:
        raise EncoderError(
            f"{bundle}: step {step} was not saved by its run (saved: {metadata.get('steps')}); "
            "list it in the run's save_at and rerun its train_zoo job"
        )
    weights = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    with atomic_path(out["model"]) as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
        digest = file_sha256(tmp)
    write_text(out["curve"], metadata[f"{prefix}curve.csv"])
    meta = json.loads(metadata[f"{prefix}meta.json"])
    write_json(out["meta"], {**meta, "weights_sha256": digest})


def _read_tensors_and_metadata(
    path: Path, expected_sha256: str | None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors = _read_tensors(path, expected_sha256)
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata() or {})
    return tensors, metadata


def file_sha256(path: PathLike) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _read_tensors(path: Path, expected_sha256: str | None) -> dict[str, torch.Tensor]:
    """The tensors of ``path``, read once: refused when their SHA-256 is not the one meta.json
    recorded (weights and meta of different runs; runs saved before digests have none)."""
    if not path.is_file():
        raise EncoderError(f"zoo checkpoint {path} does not exist: run the train_zoo rule for it")
    try:
        data = path.read_bytes()
        if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
            raise EncoderError(
                f"{path} is not the file {path.parent / 'meta.json'} was written with (SHA-256 "
                f"differs): the run was interrupted or its files were mixed; rerun train_zoo for "
                f"{path.parent.name}"
            )
        return load_bytes(data)
    except (SafetensorError, OSError, ValueError) as err:
        raise EncoderError(
            f"zoo checkpoint {path} is truncated or corrupt ({err}); delete it and rerun train_zoo"
        ) from err


def check_meta(meta: dict[str, Any], meta_path: Path) -> None:
    """The checks a config's zoo run gets, on a run's ``meta.json`` before anything is built:
    every number finite and under its cap (``timm_kwargs``, ``preprocess``: SIZE_CAPS), no
    keyword that loads weights or files, and the backbone as a whole under the size caps on the
    meta device (:func:`repdiag.encoders.size.check_model_size`)."""
    from repdiag.core.config import check_numbers
    from repdiag.core.errors import ConfigError
    from repdiag.encoders.entries import weights_kwargs
    from repdiag.encoders.size import check_model_size

    kwargs, preprocess = meta["timm_kwargs"], meta["preprocess"]
    if not isinstance(kwargs, dict) or not isinstance(preprocess, dict):
        raise EncoderError(f"{meta_path}: timm_kwargs and preprocess must be mappings")
    try:
        check_numbers({"timm_kwargs": kwargs, "preprocess": preprocess})
    except ConfigError as err:
        raise EncoderError(f"{meta_path}: {err}") from None
    bad = weights_kwargs(kwargs, "timm_kwargs")
    if bad:
        raise EncoderError(
            f"{meta_path}: {bad[0]} names a weights, file or download switch; a zoo run's "
            "meta.json may not (rerun train_zoo for it)"
        )
    sizes = [preprocess.get("input_size"), kwargs.get("img_size", 1)]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
        raise EncoderError(
            f"{meta_path}: preprocess.input_size and timm_kwargs.img_size must be positive integers"
        )
    size = max(sizes)  # the side the backbone is built for, when it differs from preprocessing
    with torch.device("meta"):
        try:
            backbone = build_backbone(meta["timm_model"], kwargs)
        except EncoderError as err:
            raise EncoderError(f"{meta_path}: {err}") from None
    check_model_size(meta_path.parent.name, backbone, size, str(meta_path))


def check_shapes(
    shapes: dict[str, torch.Size],
    tensors: dict[str, torch.Tensor],
    model_path: Path,
    meta_path: Path,
) -> None:
    """Every tensor meta.json's architecture declares (``shapes``, from a build on the meta device)
    is in the weights file with that shape, checked before the architecture is allocated: a
    meta.json that declares a head of widths [32, 25000, 25000, 32] over a file of a small one
    would otherwise allocate 3.2 GB before the strict load fails."""
    wrong = [
        f"{key} {tuple(shape)} (file: {tuple(tensors[key].shape) if key in tensors else 'absent'})"
        for key, shape in shapes.items()
        if key not in tensors or tensors[key].shape != shape
    ]
    if wrong:
        raise EncoderError(
            f"{model_path} does not hold the architecture {meta_path} declares: "
            f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''}; rerun train_zoo for "
            f"{model_path.parent.name}"
        )


def load_zoo_model(run_dir: PathLike, device: torch.device | str) -> ZooModel:
    """Rebuild the encoder of ``results/zoo/<run>/``: strict loads, eval mode, on ``device``."""
    run_dir = Path(run_dir)
    model_path, meta_path = run_dir / "model.safetensors", run_dir / "meta.json"
    try:
        meta = read_json(meta_path)
    except StoreError as err:
        raise EncoderError(f"zoo run {run_dir}: {err}") from err
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise EncoderError(f"{meta_path} lacks {missing}; rerun train_zoo for {run_dir.name}")
    check_meta(meta, meta_path)
    tensors = check_weights(
        _read_tensors(model_path, meta.get("weights_sha256")), run_dir.name, model_path
    )
    with torch.device("meta"):  # shapes first: nothing is allocated that the file does not hold
        shapes = {
            k: v.shape
            for k, v in build_backbone(meta["timm_model"], meta["timm_kwargs"]).state_dict().items()
        }
        head_meta = build_head(meta["head"])
    if head_meta is not None:
        shapes |= {HEAD_PREFIX + k: v.shape for k, v in head_meta.state_dict().items()}
    check_shapes(shapes, tensors, model_path, meta_path)
    backbone = build_backbone(meta["timm_model"], meta["timm_kwargs"])
    backbone_keys = set(backbone.state_dict())
    check_float_slots(backbone.state_dict(), tensors, run_dir.name, model_path)
    head_state = {
        k[len(HEAD_PREFIX) :]: v
        for k, v in tensors.items()
        if k not in backbone_keys and k.startswith(HEAD_PREFIX)
    }
    stray = sorted(k for k in tensors if k not in backbone_keys and not k.startswith(HEAD_PREFIX))
    absent = sorted(backbone_keys - set(tensors))
    if stray or absent:
        raise EncoderError(
            f"{model_path} does not match {meta['timm_model']} {meta['timm_kwargs']}: "
            f"missing {absent[:5]}, unexpected {stray[:5]}; rerun train_zoo for {run_dir.name}"
        )
    try:
        backbone.load_state_dict({k: tensors[k] for k in backbone_keys}, strict=True)
    except RuntimeError as err:  # a shape that is not meta.json's architecture
        raise EncoderError(
            f"{model_path} does not match {meta_path}: {' '.join(str(err).split())[:500]}; "
            f"rerun train_zoo for {run_dir.name}"
        ) from None
    head = build_head(meta["head"])
    if head is not None:
        try:
            head.load_state_dict(head_state, strict=True)
        except RuntimeError as err:
            raise EncoderError(
                f"{model_path}: head weights do not match meta.json's head: {err}"
            ) from err
    elif head_state:
        raise EncoderError(f"{model_path} has head.* weights but {meta_path} declares no head")
    backbone.eval().to(device)
    if head is not None:
        head.eval().to(device)
    return ZooModel(backbone, head, meta)
