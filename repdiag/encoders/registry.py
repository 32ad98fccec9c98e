"""Build an encoder from its config entry: one builder per ``source`` in the :data:`SOURCES` registry.

Sources (``id`` is what the entry names):

* ``timm``: ``timm.create_model(id, **kwargs)``; ``pretrained: false`` random weights, ``true`` the
  local Hugging Face / torch.hub cache, or a local weights file.
* ``open_clip``: ``open_clip.create_model(id, pretrained=tag or file, **kwargs)``; the image tower
  (``model.visual``) is the encoder.
* ``torchvision``: ``torchvision.models.get_model(id, **kwargs)``; ``pretrained`` a weights enum
  name (its file must be in the torch.hub cache) or a local weights file.
* ``hub``: entry point ``id`` of the ``hubconf.py`` in the local directory ``repo`` (what
  ``torch.hub.load(repo, id, source="local")`` runs), built with ``pretrained=False``; weights
  from ``weights``.
* ``checkpoint``: timm architecture ``id`` with weights from the safetensors file ``weights``.
* ``zoo``: ``<zoo_dir>/<id>/model.safetensors`` + ``meta.json`` written by the zoo stage.
* ``python``: ``package.module:callable`` called with ``kwargs``, returning an ``nn.Module``.

Preprocessing comes from the model's own config unless the entry's ``preprocess`` overrides it.
Weights are read as safetensors, or, for the files timm/torchvision/hub publish as ``.pth``, with
``torch.load(weights_only=True)``; a ``checkpoint``/``zoo`` file must be safetensors and a pickle is
refused without being unpickled. Nothing is downloaded: missing weights are an error that says
where to put them. Every failure is one :class:`~repdiag.core.errors.EncoderError` naming the model key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from repdiag.core.errors import ConfigError, EncoderError, RegistryError
from repdiag.core.registry import Registry
from repdiag.encoders.entries import (
    PICKLE_SUFFIXES,
    check_entry,
    check_model_files,
    is_local_path,
)
from repdiag.encoders.heads import WithHead
from repdiag.encoders.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocess,
    from_open_clip,
    from_timm,
    from_torchvision,
)
from repdiag.encoders.taps import TapPlan, run_taps, tap_plan

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Built:
    """What a source builder returns: the module, its own preprocessing, and a pooling it imposes."""

    model: nn.Module
    preprocess: Preprocess
    pooling: str | None = None


Builder = Callable[[str, Mapping[str, Any], Path], Built]
SOURCES: Registry[Builder] = Registry("encoder source")


@dataclasses.dataclass(eq=False)
class Encoder:
    """A built encoder: model in eval mode with frozen parameters, its preprocessing and its taps."""

    key: str
    source: str
    family: str
    model: nn.Module
    preprocess: Preprocess
    pooling: str
    plan: TapPlan = dataclasses.field(repr=False)
    entry: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

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


def _fail(key: str, message: str) -> EncoderError:
    return EncoderError(f"model {key!r}: {message}")


# --- weight files ----------------------------------------------------------------------------


def _is_pickle(path: Path, head: bytes) -> bool:
    """torch.save zip archives, raw pickles (protocol 2-5) and the usual pickle suffixes."""
    zip_archive = head[:4] == b"PK\x03\x04"
    raw_pickle = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    return zip_archive or raw_pickle or path.suffix.lower() in PICKLE_SUFFIXES


def check_safetensors(path: str | Path, key: str) -> Path:
    """Refuse a missing, pickle or malformed file before anything reads it (header-only check)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise _fail(
            key,
            f"weights file {path} does not exist; check the path (or run the rule that writes it)",
        )
    with open(path, "rb") as handle:
        head = handle.read(16)
    if _is_pickle(path, head):
        raise _fail(
            key,
            f"{path} is a pickle (torch.save) file; it is refused without being unpickled. Convert it "
            "once where you trust it: safetensors.torch.save_file(torch.load(f, weights_only=True), "
            "'model.safetensors')",
        )
    size = path.stat().st_size
    header_len = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    if header_len < 2 or 8 + header_len > size or head[8:9] != b"{":
        raise _fail(key, f"{path} is not a valid safetensors file (truncated or corrupt header)")
    return path


def check_weights(state: Mapping[str, Any], key: str, where: object) -> dict[str, Any]:
    """Refuse bool and non-finite weights naming the tensor; cast float16/bfloat16 to float32.

    Integer tensors pass (index buffers such as ``relative_position_index``); :func:`load_into`
    refuses one where the model has a floating tensor.
    """
    checked, cast = {}, []
    for name, tensor in state.items():
        if isinstance(tensor, torch.Tensor):
            if tensor.dtype == torch.bool or tensor.is_complex():
                raise _fail(
                    key,
                    f"{where}: tensor {name!r} has dtype {tensor.dtype}; weights must be floating "
                    "point (re-export the checkpoint from the trained model)",
                )
            if tensor.is_floating_point():
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    raise _fail(
                        key,
                        f"{where}: tensor {name!r} holds {bad} non-finite values (NaN/inf); "
                        "the checkpoint is damaged or diverged",
                    )
                if tensor.dtype in (torch.float16, torch.bfloat16):
                    cast.append(f"{name} ({str(tensor.dtype).removeprefix('torch.')})")
                    tensor = tensor.to(torch.float32)
        checked[name] = tensor
    if cast:
        log.warning(
            "model %s: %d half-precision weights of %s cast to float32, e.g. %s",
            key,
            len(cast),
            where,
            cast[:3],
        )
    return checked


def check_float_slots(
    own: Mapping[str, torch.Tensor], state: Mapping[str, Any], key: str, where: object
) -> None:
    """Refuse an integer tensor in ``state`` where the model (``own``) has a floating one."""
    not_float = [
        k
        for k in own
        if isinstance(state.get(k), torch.Tensor)
        and own[k].is_floating_point()
        and not state[k].is_floating_point()
    ]
    if not_float:
        k = not_float[0]
        raise _fail(
            key,
            f"{where}: tensor {k!r} has dtype {state[k].dtype} where the model has "
            f"{own[k].dtype} ({len(not_float)} such tensors); weights must be floating point",
        )


def load_safetensors(path: str | Path, key: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = check_safetensors(path, key)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise _fail(key, f"cannot read {path} ({err}); the file is truncated or corrupt") from err
    return check_weights(state, key, path)


def load_weights_file(path: str | Path, key: str) -> dict[str, torch.Tensor]:
    """A state dict from safetensors, or from a ``.pth``-style file with ``weights_only=True``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise _fail(key, f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        return load_safetensors(path, key)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling refused or corrupt: torch raises several types
        raise _fail(
            key,
            f"cannot read {path} with torch.load(weights_only=True) ({type(err).__name__}: {err})",
        ) from err
    for wrapper in ("state_dict", "model", "module"):
        if (
            isinstance(state, dict)
            and isinstance(state.get(wrapper), dict)
            and not any(isinstance(v, torch.Tensor) for v in state.values())
        ):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise _fail(key, f"{path} holds a {type(state).__name__}, not a state dict")
    return check_weights(state, key, path)


def load_into(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    key: str,
    *,
    prefix: str = "",
    strict: bool = True,
    where: str = "weights",
) -> None:
    """Load ``state`` (keys starting with ``prefix``, prefix removed) into ``module``.

    ``strict=False`` tolerates weights the module does not use (SwAV's prototypes) and removes a
    final classifier (``fc``/``head``/``classifier``) that the weights do not include, instead of
    leaving it random (the Barlow Twins and SwAV hub ResNet-50s); any other missing weight fails.
    """
    if prefix:
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    own = module.state_dict()
    missing = sorted(k for k in set(own) - set(state) if not k.endswith("num_batches_tracked"))
    if missing and not strict:
        for name in ("fc", "head", "classifier"):
            layer = getattr(module, name, None)
            keys = (
                {f"{name}.{k}" for k in layer.state_dict()}
                if isinstance(layer, nn.Module)
                else set()
            )
            if keys and keys <= set(missing):
                setattr(module, name, nn.Identity())
                log.info(
                    "model %s: %s is not in the %s: removed, so the model has no head tap",
                    key,
                    name,
                    where,
                )
                missing = [k for k in missing if k not in keys]
        own = module.state_dict()
    unexpected = sorted(set(state) - set(own))
    if missing:
        raise _fail(key, f"{where} lack {len(missing)} weights of the model, e.g. {missing[:5]}")
    if unexpected and strict:
        raise _fail(
            key,
            f"{where} hold {len(unexpected)} weights the model does not have, e.g. {unexpected[:5]} "
            "(set strict: false to ignore them, or state_dict_prefix to select a sub-model)",
        )
    if unexpected:
        log.info(
            "model %s: ignoring %d unused weights, e.g. %s", key, len(unexpected), unexpected[:5]
        )
    check_float_slots(own, state, key, where)
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise _fail(
            key,
            f"{where}: {len(wrong)} weights have the wrong shape, e.g. {k} {tuple(state[k].shape)} "
            f"vs {tuple(own[k].shape)} in the model; check the architecture and kwargs",
        )
    module.load_state_dict({k: state[k] for k in own if k in state}, strict=True)


def _hf_cached(repo_id: str, filenames: Iterable[str]) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in filenames:
        found = try_to_load_from_cache(repo_id, filename)
        if isinstance(found, str):
            return found
    return None


def _hf_cache_dir() -> str:
    """The Hugging Face hub cache folder this process reads (HF_HUB_CACHE, HF_HOME/hub, ...)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return "(huggingface_hub not installed)"
    return str(constants.HF_HUB_CACHE)


def _close(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


# --- builders ----------------------------------------------------------------------------------


def _timm_cached(key: str, name: str) -> None:
    """Fail before any download when pretrained timm weights are in neither local cache."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg or {})
    hub_id, url = cfg.get("hf_hub_id"), cfg.get("url")
    files = [
        cfg.get("hf_hub_filename"),
        "model.safetensors",
        "pytorch_model.bin",
        "open_clip_model.safetensors",
    ]
    if hub_id and _hf_cached(hub_id, [f for f in files if f]):
        return
    if (
        url
        and (Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name).is_file()
    ):
        return
    raise _fail(
        key,
        f"pretrained weights of timm model {name!r} are not in the local Hugging Face cache "
        f"{_hf_cache_dir()} ({hub_id or 'no hub id'}) or the torch.hub cache "
        f"{Path(torch.hub.get_dir()) / 'checkpoints'} and nothing is downloaded here: fill the "
        "cache on a machine with internet (timm.create_model(name, pretrained=True)) and copy it "
        "there (HF_HOME), or set pretrained: /path/to/weights.safetensors",
    )


@SOURCES.register("timm")
def build_timm(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    import timm

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if not timm.is_model(name):
        raise _fail(
            key, f"{name!r} is not a timm model{_close(name.split('.')[0], timm.list_models())}"
        )
    pretrained = entry.get("pretrained")
    if pretrained is True:
        _timm_cached(key, name)
    elif isinstance(pretrained, str):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise _fail(key, f"pretrained weights file {path} does not exist")
        # read by the project's loader (byte check, weights_only=True) and handed to timm as a
        # state dict: timm applies its filters and classifier handling but never opens the file
        state = load_weights_file(path, key)
        overlay: dict[str, Any] = {"state_dict": state}
        if kwargs.get("num_classes"):  # the file's classifier is the one asked for: keep it
            overlay["num_classes"] = kwargs["num_classes"]
        kwargs["pretrained_cfg_overlay"] = overlay
    try:
        model = timm.create_model(name, pretrained=bool(pretrained), **kwargs)
    except EncoderError:
        raise
    except Exception as err:  # timm raises RuntimeError/TypeError/ValueError/AssertionError
        raise _fail(key, f"timm could not build {name!r} ({type(err).__name__}: {err})") from err
    if isinstance(pretrained, str):
        check_float_slots(model.state_dict(), state, key, pretrained)
    return Built(model, from_timm(model))


def resolve_open_clip_pretrained(key: str, name: str, pretrained: object) -> str | None:
    """A local weights file or a cached pretrained tag of ``name``; ``None`` for random weights."""
    import open_clip

    if not pretrained:
        return None
    pretrained = str(pretrained)
    if is_local_path(pretrained):
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise _fail(key, f"pretrained weights file {path} does not exist")
        return str(path)
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained not in tags:
        raise _fail(key, f"{pretrained!r} is not a pretrained tag of {name}; tags: {tags}")
    _open_clip_cached(key, name, pretrained)
    return pretrained


def _open_clip_cached(key: str, name: str, tag: str) -> None:
    import open_clip

    cfg = open_clip.get_pretrained_cfg(name, tag)
    hub = (cfg.get("hf_hub") or "").strip("/")
    if hub and _hf_cached(hub, ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]):
        return
    url = cfg.get("url")
    if url and (Path("~/.cache/clip").expanduser() / Path(urlparse(url).path).name).is_file():
        return
    raise _fail(
        key,
        f"open_clip weights {name}/{tag} are not in the local cache ({hub or url}) and nothing is "
        "downloaded here: copy the cache from a machine with internet or set pretrained to a local file",
    )


def _open_clip_load_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """What ``open_clip.load_checkpoint`` does after reading its file, on an already-read state."""
    from open_clip import factory

    if state and next(iter(state)).startswith("module."):
        state = {k[len("module.") :]: v for k, v in state.items()}
    state = factory.convert_state_dict(model, state)
    if "positional_embedding" in state and not hasattr(model, "positional_embedding"):
        state = factory.convert_to_custom_text_state_dict(state)
    for name in ("logit_scale", "logit_bias"):
        own = getattr(model, name, None)
        if name in state and own is not None and own.ndim != state[name].ndim:
            state[name] = state[name].reshape(own.shape)
    if "logit_bias" not in state and getattr(model, "logit_bias", None) is not None:
        state["logit_bias"] = torch.zeros_like(state["logit_scale"])
    state.pop("text.transformer.embeddings.position_ids", None)
    factory.resize_pos_embed(state, model)
    factory.resize_text_pos_embed(state, model)
    model.load_state_dict(state, strict=True)


def create_open_clip(
    key: str, name: str, pretrained: str | None, kwargs: Mapping[str, Any]
) -> nn.Module:
    """``open_clip.create_model`` with only allowlisted ``kwargs`` (see ``entries.check_kwargs``);
    a local weights file is read by :func:`load_weights_file` and loaded as a state dict, so
    open_clip never opens (or unpickles) a file itself. ``pretrained``: as resolved by
    :func:`resolve_open_clip_pretrained`."""
    import open_clip

    from repdiag.encoders.entries import check_kwargs

    try:
        check_kwargs(key, {"source": "open_clip", "kwargs": kwargs})
    except ConfigError as err:
        raise _fail(key, str(err)) from None
    kwargs = dict(kwargs)
    state, weights_file = None, pretrained
    if pretrained and is_local_path(pretrained):
        state = load_weights_file(pretrained, key)
        pretrained = None
        kwargs.update(pretrained_image=False, pretrained_text=False)
    model = open_clip.create_model(name, pretrained=pretrained or None, **kwargs)
    if state is not None:
        check_float_slots(model.state_dict(), state, key, weights_file)
        _open_clip_load_state(model, state)
    return model


@SOURCES.register("open_clip")
def build_open_clip(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    import open_clip

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if name not in open_clip.list_models():
        raise _fail(
            key, f"{name!r} is not an open_clip model{_close(name, open_clip.list_models())}"
        )
    pretrained = entry.get("pretrained")
    if pretrained is True:
        raise _fail(
            key, "open_clip needs pretrained: a tag (e.g. openai) or a local file, not true"
        )
    pretrained = resolve_open_clip_pretrained(key, name, pretrained)
    try:
        model = create_open_clip(key, name, pretrained, kwargs)
    except EncoderError:
        raise
    except Exception as err:  # open_clip raises RuntimeError/ValueError/TypeError
        raise _fail(
            key, f"open_clip could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    preprocess = from_open_clip(open_clip.get_model_preprocess_cfg(model))
    return Built(model.visual, preprocess)


def _torchvision_cached(key: str, name: str, weights: Any) -> Path:
    """The torch.hub cache file of a torchvision weights enum, or an error saying where to put it."""
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name
    if not cached.is_file():
        raise _fail(
            key,
            f"torchvision weights {name}/{weights.name} are not in the torch.hub cache ({cached}) "
            f"and nothing is downloaded here: download {weights.url} to that path, or set "
            "pretrained to a local file",
        )
    return cached


def check_cached_weights(key: str, entry: Mapping[str, Any]) -> None:
    """Fail, naming the model, when the library-cache weights ``entry`` names are not cached
    (``pretrained: true`` for timm, a pretrained tag for open_clip, a weights enum name for
    torchvision): the run's ``onstart`` check, before any job starts."""
    source, name, pretrained = entry.get("source"), str(entry.get("id")), entry.get("pretrained")
    if not pretrained or (isinstance(pretrained, str) and is_local_path(pretrained)):
        return
    if source == "timm" and pretrained is True:
        _timm_cached(key, name)
    elif source == "open_clip":
        resolve_open_clip_pretrained(key, name, pretrained)
    elif source == "torchvision" and isinstance(pretrained, str):
        import torchvision

        enum = torchvision.models.get_model_weights(name)
        if pretrained not in enum.__members__:
            raise _fail(key, f"{pretrained!r} is not a weights name of {name}")
        _torchvision_cached(key, name, enum[pretrained])


def check_weights_available(config: Mapping[str, Any], models: Iterable[str] | None = None) -> None:
    """A real run's ``onstart`` check, before any job: the weights files and hub folders of
    ``models`` (default: all) exist and their library-cache weights are cached."""
    check_model_files(config, models)
    entries = config.get("models") or {}
    for key in entries if models is None else [m for m in entries if m in set(models)]:
        check_cached_weights(key, entries[key])


@SOURCES.register("torchvision")
def build_torchvision(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    import torchvision

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    builders = torchvision.models.list_models()
    if name not in builders:
        raise _fail(key, f"{name!r} is not a torchvision model builder{_close(name, builders)}")
    pretrained = entry.get("pretrained")
    weights, state = None, None
    if isinstance(pretrained, str) and is_local_path(pretrained):
        state = load_weights_file(pretrained, key)
    elif isinstance(pretrained, str) and pretrained:
        enum = torchvision.models.get_model_weights(name)
        if pretrained not in enum.__members__:
            raise _fail(
                key,
                f"{pretrained!r} is not a weights name of {name}; choose one of {list(enum.__members__)}",
            )
        weights = enum[pretrained]
        state = load_weights_file(_torchvision_cached(key, name, weights), key)
        if "categories" in weights.meta:
            kwargs.setdefault("num_classes", len(weights.meta["categories"]))
        if name.startswith("vit_") and "min_size" in weights.meta:
            kwargs.setdefault("image_size", weights.meta["min_size"][0])
    try:
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    except Exception as err:
        raise _fail(
            key, f"torchvision could not build {name!r} ({type(err).__name__}: {err})"
        ) from err
    if state is not None:
        load_into(model, state, key, where=f"weights of {name}")
    return Built(model, from_torchvision(weights))


@contextlib.contextmanager
def _on_sys_path(directory: Path):
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(directory))


def _hub_entry_point(key: str, repo: Path, name: str) -> Callable[..., Any]:
    """Import ``repo/hubconf.py`` (as ``torch.hub.load(source="local")`` does) and get ``name``."""
    hubconf = repo / "hubconf.py"
    if not hubconf.is_file():
        raise _fail(
            key,
            f"{repo} is not a torch.hub directory (no hubconf.py); set repo to a local hub checkout",
        )
    module_name = "repdiag_hubconf_" + hashlib.sha1(str(repo.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, hubconf)
    module = importlib.util.module_from_spec(spec)
    with _on_sys_path(repo):
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise _fail(key, f"importing {hubconf} failed ({type(err).__name__}: {err})") from err
    entry_point = getattr(module, name, None)
    if not callable(entry_point) or name.startswith("_"):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise _fail(key, f"{hubconf} has no entry point {name!r}; it has {sorted(names)}")
    return entry_point


@SOURCES.register("hub")
def build_hub(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    repo, name = Path(str(entry["repo"])).expanduser(), str(entry["id"])
    kwargs = dict(entry.get("kwargs") or {})
    entry_point = _hub_entry_point(key, repo, name)
    if "pretrained" in inspect.signature(entry_point).parameters:
        kwargs["pretrained"] = False  # the entry point's own loader would download and unpickle
    with _on_sys_path(repo):
        try:
            model = entry_point(**kwargs)
        except Exception as err:
            raise _fail(
                key, f"hub entry point {name}({kwargs}) failed ({type(err).__name__}: {err})"
            ) from err
    if not isinstance(model, nn.Module):
        raise _fail(
            key, f"hub entry point {name} returned {type(model).__name__}, not an nn.Module"
        )
    if entry.get("weights"):
        state = load_weights_file(entry["weights"], key)
        load_into(
            model,
            state,
            key,
            prefix=entry.get("state_dict_prefix") or "",
            strict=entry.get("strict", True),
            where=str(entry["weights"]),
        )
    else:
        log.warning("model %s: hub entry without weights: random initialisation", key)
    return Built(model, from_torchvision(None))


@SOURCES.register("checkpoint")
def build_checkpoint(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    import timm

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if not entry.get("weights"):
        raise _fail(key, "source checkpoint needs weights: <file>.safetensors")
    state = load_safetensors(entry["weights"], key)
    if not timm.is_model(name):
        raise _fail(
            key,
            f"{name!r} is not a timm architecture{_close(name.split('.')[0], timm.list_models())}",
        )
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as err:
        raise _fail(key, f"timm could not build {name!r} ({type(err).__name__}: {err})") from err
    load_into(
        model,
        state,
        key,
        prefix=entry.get("state_dict_prefix") or "",
        strict=entry.get("strict", True),
        where=str(entry["weights"]),
    )
    return Built(model, from_timm(model))


@SOURCES.register("zoo")
def build_zoo(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    """The zoo's own loader (``repdiag.encoders.zoo.checkpoint.load_zoo_model``): the timm backbone
    ``timm.create_model(meta.timm_model, **meta.timm_kwargs)`` and the declared head, loaded strictly."""
    root = zoo_dir / str(entry["id"])
    weights_path = root / "model.safetensors"
    for path in (root / "meta.json", weights_path):
        if not path.is_file():
            raise _fail(
                key,
                f"{path} does not exist: train it first (snakemake {weights_path}, rule train_zoo)",
            )
    check_safetensors(weights_path, key)
    from repdiag.encoders.zoo.checkpoint import load_zoo_model

    try:
        zoo = load_zoo_model(root)
        preprocess = Preprocess(**zoo.meta["preprocess"])
    except (EncoderError, TypeError) as err:
        raise _fail(key, str(err)) from err
    model = zoo.backbone if zoo.head is None else WithHead(zoo.backbone, zoo.head)
    return Built(model, preprocess, pooling=zoo.meta["pooling"])


@SOURCES.register("python")
def build_python(key: str, entry: Mapping[str, Any], zoo_dir: Path) -> Built:
    target, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise _fail(
            key, f"cannot import {module_name!r} ({err}); is it installed or on PYTHONPATH?"
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _fail(key, f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise _fail(key, f"{target} is not callable")
    try:
        model = obj(**kwargs)
    except Exception as err:  # user code: any exception type
        raise _fail(key, f"{target}(**{kwargs}) failed ({type(err).__name__}: {err})") from err
    if not isinstance(model, nn.Module):
        raise _fail(key, f"{target}(**kwargs) returned {type(model).__name__}, not an nn.Module")
    if any(cls.__module__.startswith("timm.models") for cls in type(model).__mro__):
        return Built(model, from_timm(model))
    own = getattr(model, "preprocess_cfg", None)
    if isinstance(own, Mapping):
        try:
            return Built(model, Preprocess(**own))
        except (TypeError, EncoderError) as err:
            raise _fail(key, f"{target}: bad preprocess_cfg {dict(own)} ({err})") from err
    return Built(model, Preprocess(224, IMAGENET_MEAN, IMAGENET_STD, "bicubic"))


def build_encoder(
    key: str,
    entry: Mapping[str, Any],
    *,
    zoo_dir: str | Path = "results/zoo",
    default_pooling: str = "cls",
) -> Encoder:
    """Build the encoder of config entry ``models.<key>``.

    Pooling: the entry's ``pooling``, else the one a zoo model was trained with, else
    ``default_pooling`` (the workflow fills entries from ``embeddings.pooling`` at config time).
    """
    entry = dict(entry)
    try:
        check_entry(key, entry, check_names=False)
        builder = SOURCES.get(str(entry.get("source")))
    except (ConfigError, RegistryError) as err:
        raise _fail(key, str(err)) from None
    if not entry.get("id"):
        raise _fail(key, "the entry has no id")
    built = builder(key, entry, Path(zoo_dir))
    try:
        preprocess = built.preprocess.updated(entry.get("preprocess"))
    except EncoderError as err:
        raise _fail(key, str(err)) from None
    pooling = entry.get("pooling") or built.pooling or default_pooling
    model = built.model.eval()
    model.requires_grad_(False)
    try:
        plan = tap_plan(model, pooling)
    except EncoderError as err:
        raise _fail(key, str(err)) from None
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
    )
