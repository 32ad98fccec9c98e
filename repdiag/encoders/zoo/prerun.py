"""Pre-run checks of the zoo: every backbone a run trains is built once on the meta device.

Registered in ``repdiag.encoders.build_checks()`` and run by ``repdiag validate`` and a real run's
``onstart`` (``repdiag.core.checks.check_before_run``), not on every parse: building needs timm,
whose import takes seconds. A backbone that built is remembered in ``cache_dir()`` per timm and
torch version (as :func:`repdiag.encoders.entries.timm_architectures` remembers timm's names), so
later runs of the same config import nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from repdiag.core.errors import ConfigError
from repdiag.core.version import __version__
from repdiag.encoders.entries import cache_dir
from repdiag.encoders.zoo.spec import run_spec, zoo_runs


def built_before_path() -> Path:
    """The file of backbones that built under this timm, torch and repdiag."""
    versions = "-".join(importlib.metadata.version(name) for name in ("timm", "torch"))
    return cache_dir() / f"zoo-backbones-{versions}-{__version__}.json"


def _read_built() -> set[str]:
    try:
        digests = json.loads(built_before_path().read_text())
    except (OSError, ValueError):
        return set()
    return {d for d in digests if isinstance(d, str)} if isinstance(digests, list) else set()


def _write_built(digests: set[str]) -> None:
    path = built_before_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(sorted(digests)))
        partial.replace(path)
    except OSError:  # an unwritable cache folder only costs the next run a build
        pass


def _digest(spec: Mapping[str, Any]) -> str:
    what = [spec["timm_model"], spec["timm_kwargs"], spec["image_size"], spec["objective"]]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _build_on_meta(spec: Mapping[str, Any]) -> None:
    """Build ``spec``'s backbone as training does (its kwargs completed), on the meta device."""
    import torch

    from repdiag.encoders.zoo.backbones import backbone_kwargs, build_backbone
    from repdiag.encoders.zoo.objectives import OBJECTIVES

    extras = OBJECTIVES.get(spec["objective"]).backbone_extras
    with torch.device("meta"):
        kwargs = backbone_kwargs(
            spec["timm_model"], spec["timm_kwargs"], spec["image_size"], extras
        )
        build_backbone(spec["timm_model"], kwargs)


def check_zoo_backbones(config: Mapping[str, Any], models: Collection[str] | None = None) -> None:
    """Build the backbone of every zoo run that ``models`` (default: every model) train, on the
    meta device (nothing allocated, about 0.1 s each once timm is imported). A backbone timm
    cannot build (``num_heads`` not dividing ``embed_dim``, an unknown keyword, a wrong type) is a
    ConfigError naming ``zoo.backbones.<name>.timm_kwargs`` with timm's message."""
    entries = config.get("models") or {}
    chosen = {k: e for k, e in entries.items() if models is None or k in models}
    built = _read_built()
    before = set(built)
    for run in zoo_runs({"models": chosen}):
        spec = run_spec(config, run)
        digest = _digest(spec)
        if digest in built:
            continue
        try:
            _build_on_meta(spec)
        except Exception as err:  # timm raises TypeError, ValueError, AssertionError, ...
            raise ConfigError(
                f"zoo.backbones.{spec['backbone']}.timm_kwargs: timm cannot build "
                f"{spec['timm_model']!r} with {spec['timm_kwargs']} (zoo run {run!r}): "
                f"{type(err).__name__}: {err}"
            ) from None
        built.add(digest)
    if built != before:
        _write_built(built)
