"""The weights a run needs are there before its first job: weights files, hub folders and
library caches (``weights_checks()`` of :mod:`repdiag.encoders`, run by a real run's ``onstart``
and ``repdiag validate``).

Imports neither torch nor the model libraries unless an entry names library-cache weights, so a
run's start pays for them only then (the build checks are remembered, these are not: a file
changes without the config changing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from repdiag.encoders.entries import check_model_files, is_local_path


def check_cached_weights(key: str, entry: Mapping[str, Any]) -> None:
    """Fail, naming the model, when the library-cache weights ``entry`` names are not cached
    (``pretrained: true`` for timm, a pretrained tag for open_clip, a weights enum name for
    torchvision): the run's ``onstart`` check, before any job starts. The sources' modules
    (and torch) are imported only for an entry that names such weights."""
    source, name, pretrained = entry.get("source"), str(entry.get("id")), entry.get("pretrained")
    if not pretrained or (isinstance(pretrained, str) and is_local_path(pretrained)):
        return
    if source == "timm" and pretrained is True:
        from repdiag.encoders.sources.timm import timm_cached

        timm_cached(key, name)
    elif source == "open_clip":
        from repdiag.encoders.sources.open_clip import resolve_open_clip_pretrained

        resolve_open_clip_pretrained(key, name, pretrained)
    elif source == "torchvision" and isinstance(pretrained, str):
        import torchvision

        from repdiag.encoders.entries import model_error
        from repdiag.encoders.sources.torchvision import torchvision_cached

        enum = torchvision.models.get_model_weights(name)
        if pretrained not in enum.__members__:
            raise model_error(key, f"{pretrained!r} is not a weights name of {name}")
        torchvision_cached(key, name, enum[pretrained])


def check_weights_available(config: Mapping[str, Any], models: Iterable[str] | None = None) -> None:
    """A real run's ``onstart`` check, before any job: the weights files and hub folders of
    ``models`` (default: all) exist and their library-cache weights are cached (a
    WEIGHTS_CHECK of :mod:`repdiag.encoders`; it imports torch only for library-cache weights)."""
    check_model_files(config, models)
    entries = config.get("models") or {}
    for key in entries if models is None else [m for m in entries if m in set(models)]:
        check_cached_weights(key, entries[key])
