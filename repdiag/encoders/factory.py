"""Build an encoder from its config entry: :func:`build_encoder`, the one factory over every source
(:mod:`repdiag.encoders.sources`), and the pre-run check that the weights a config names are there.

Preprocessing comes from the model's own config unless the entry's ``preprocess`` overrides it.
Weights are read safely (:mod:`repdiag.encoders.weights`); nothing is downloaded. Every failure is
one :class:`~repdiag.core.errors.EncoderError` naming the model key. With ``meta=True`` the
architecture alone is built, with random weights on the meta device (shapes, no data; nothing is
read or downloaded): what the cost planner and the pre-run tap checks use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repdiag.core.config import SEED_LIMIT
from repdiag.core.errors import ConfigError, EncoderError, RegistryError
from repdiag.core.offline import enforce_offline
from repdiag.encoders.entries import check_entry, model_error
from repdiag.encoders.preprocess import Preprocess
from repdiag.encoders.sources import SOURCES, BuildOptions
from repdiag.encoders.sources.base import Built
from repdiag.encoders.taps import TapPlan, run_taps, tap_plan

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Encoder:
    """A built encoder: model in eval mode with frozen parameters, its preprocessing and its taps;
    ``origin``: what its source built it as, in words (e.g. ``timm resnet50``)."""

    key: str
    source: str
    family: str
    model: nn.Module
    preprocess: Preprocess
    pooling: str
    plan: TapPlan = dataclasses.field(repr=False)
    entry: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    origin: str = dataclasses.field(default="", repr=False)

    @property
    def layers(self) -> list[str]:
        """Tap names in depth order: blocks or stages, ``final``, then ``head`` when present."""
        return self.plan.layers

    @property
    def derived_taps(self) -> dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
        """Taps that are a row-wise function of another tap: ``{tap: (parent, fn)}`` (see TapPlan)."""
        return dict(self.plan.derived)

    def layer_outputs(
        self, x: torch.Tensor, layers: Iterable[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """``{layer: (N, D_layer)}`` on preprocessed ``x`` (N, 3, S, S); differentiable."""
        return run_taps(self.plan, x, layers)

    def to(self, device: torch.device | str) -> Encoder:
        self.model.to(device)
        return self

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.key,
            "source": self.source,
            "family": self.family,
            "pooling": self.pooling,
            "preprocess": self.preprocess.as_dict(),
            "layers": self.layers,
            "taps": self.plan.kind,
        }


SOURCE_LIBRARIES: dict[str, tuple[str, ...]] = {
    "timm": ("torch.hub", "timm.models._hub"),
    "checkpoint": ("torch.hub", "timm.models._hub"),
    "zoo": ("torch.hub", "timm.models._hub"),
    "open_clip": ("torch.hub", "open_clip.pretrained", "open_clip.openai"),
    "torchvision": ("torch.hub",),
    "hub": ("torch.hub",),
    "python": ("torch.hub",),
}
"""The modules with download functions each source's build may reach (see
:func:`repdiag.core.offline.enforce_offline`)."""


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Hugging Face libraries in offline mode (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``) for a
    block: a build that needs the network fails instead of waiting on it."""
    saved = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({name: "1" for name in saved})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build_encoder(
    key: str,
    entry: Mapping[str, Any],
    *,
    zoo_dir: str | Path = "results/zoo",
    default_pooling: str = "cls",
    meta: bool = False,
    config: Mapping[str, Any] | None = None,
) -> Encoder:
    """Build the encoder of config entry ``models.<key>``.

    Pooling: the entry's ``pooling``, else the one a zoo model was trained with, else
    ``default_pooling`` (the workflow fills entries from ``embeddings.pooling`` at config time).
    ``meta``: the architecture alone, random weights on the meta device, offline (``config``: the
    whole config, where a zoo run's spec is read); ``Encoder.origin`` says what it was built as.
    """
    entry = dict(entry)
    try:
        check_entry(key, entry, check_names=False)
        builder = SOURCES.get(str(entry.get("source")))
    except (ConfigError, RegistryError) as err:
        raise model_error(key, str(err)) from None
    if not entry.get("id"):
        raise model_error(key, "the entry has no id")
    options = BuildOptions(Path(zoo_dir), meta=meta, config=config)
    for library in SOURCE_LIBRARIES.get(str(entry["source"]), ()):
        importlib.import_module(library)  # imported first, so that its downloads are replaced
    enforce_offline()  # whatever the environment says (HF_HUB_OFFLINE=0 included)
    with offline() if meta else contextlib.nullcontext(), seeded_init(key):
        built = builder(key, entry, options)
    return _encoder(key, entry, built, default_pooling)


def init_seed(key: str) -> int:
    """The seed of model ``key``'s random initialisation: the first 8 bytes of SHA-256(key)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % SEED_LIMIT


@contextlib.contextmanager
def seeded_init(key: str) -> Iterator[None]:
    """Build under the CPU generator seeded with :func:`init_seed`, restored afterwards.

    Random weights (``pretrained: false``, an architecture without a weights file) are then
    the same network in every job that builds ``key`` (extraction, Jacobians, a rerun): without
    it each job drew its own, and a random-weight model's embeddings and Jacobian spectra came
    from different networks. Two keys draw two networks. Loaded weights replace the draw.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(init_seed(key))
        yield


def encoder_from_module(
    model: nn.Module, key: str = "model", *, family: str = "other", pooling: str = "cls"
) -> Encoder:
    """The encoder of any ``nn.Module`` (a notebook's own model), built as a ``python`` entry
    would be: the same taps, and preprocessing from timm's config for a timm model, the module's
    own ``preprocess_cfg``, else ImageNet's at 224 px."""
    from repdiag.encoders.sources.python import built_from_module

    entry = {"source": "python", "id": type(model).__qualname__, "family": family}
    built = built_from_module(key, model, f"module {type(model).__module__}.{entry['id']}")
    return _encoder(key, entry | {"pooling": pooling}, built, pooling)


def _encoder(key: str, entry: dict[str, Any], built: Built, default_pooling: str) -> Encoder:
    """Preprocessing, pooling and taps of a built model (frozen, in eval mode)."""
    try:
        preprocess = built.preprocess.updated(entry.get("preprocess"))
    except EncoderError as err:
        raise model_error(key, str(err)) from None
    pooling = entry.get("pooling") or built.pooling or default_pooling
    model = built.model.eval()
    model.requires_grad_(False)
    try:
        plan = tap_plan(model, pooling)
    except EncoderError as err:
        raise model_error(key, str(err)) from None
    log.info(
        "model %s: %s, %d taps, pooling %s, %s",
        key,
        plan.kind,
        len(plan.layers),
        pooling,
        preprocess,
    )
    return Encoder(
        key=key,
        source=str(entry["source"]),
        family=str(entry.get("family", "other")),
        model=model,
        preprocess=preprocess,
        pooling=pooling,
        plan=plan,
        entry=entry,
        origin=built.origin,
    )


SIZE_CHECKED_SOURCES = frozenset({"zoo", "timm", "checkpoint", "torchvision", "open_clip"})
"""Sources built from library code on the meta device; a python or hub entry would run the user's
code to be built (its job builds it once)."""


def check_model_sizes(config: Mapping[str, Any], models: Iterable[str] | None = None) -> None:
    """Every model of ``models`` (default: all) from :data:`SIZE_CHECKED_SOURCES`, built on the
    meta device as its job builds it (a zoo model from its run's spec), is under the caps of
    :func:`repdiag.encoders.size.check_model_size` as a whole; a BUILD_CHECK of
    :mod:`repdiag.encoders`, run by ``repdiag validate`` and a real run's ``onstart``. A model
    that cannot be built here is left to the checks (or the job) that report it."""
    from repdiag.encoders.size import check_model_size

    entries = config.get("models") or {}
    chosen = set(entries) if models is None else set(models)
    for key, entry in entries.items():
        if key not in chosen or entry.get("source") not in SIZE_CHECKED_SOURCES:
            continue
        try:
            encoder = build_encoder(
                key,
                entry,
                default_pooling=config["embeddings"]["pooling"],
                meta=True,
                config=config,
            )
        except Exception:  # not this check's error: the build checks or the job report it
            continue
        where = (
            f"zoo run {entry['id']!r} (zoo.objectives, zoo.backbones)"
            if entry.get("source") == "zoo"
            else f"models.{key}"
        )
        check_model_size(key, encoder.model, encoder.preprocess.input_size, where)
