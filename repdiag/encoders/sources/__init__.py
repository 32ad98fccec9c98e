"""Encoder sources: one builder per ``source`` of a config entry, in the :data:`SOURCES` registry.

Sources (``id`` is what the entry names): ``timm`` and ``checkpoint`` (:mod:`.timm`),
``open_clip`` (:mod:`.open_clip`), ``torchvision`` (:mod:`.torchvision`), ``hub`` (:mod:`.hub`),
``zoo`` (:mod:`.zoo`) and ``python`` (:mod:`.python`). A builder is
``builder(key, entry, options) -> Built`` (:mod:`.base`); each has a meta-device mode
(``BuildOptions(meta=True)``) that builds the architecture alone, with random weights on the meta
device, reading and downloading nothing. Nothing is downloaded in any mode: missing weights are an
error that says where to put them. :func:`repdiag.encoders.factory.build_encoder` is the factory
over them.
"""

from repdiag.encoders.sources import hub, open_clip, python, timm, torchvision, zoo
from repdiag.encoders.sources.base import SOURCES, BuildOptions, Built

__all__ = ["SOURCES", "BuildOptions", "Built"]

# the modules above register their builders in SOURCES when imported
_REGISTERED = (hub, open_clip, python, timm, torchvision, zoo)
