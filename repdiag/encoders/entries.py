"""Model entries of the config, without importing torch: checks, defaults, and the files a job reads.

The Snakefile imports this module while it parses the workflow, so it stays light: the names of
``timm`` and ``checkpoint`` entries are checked against timm's architecture list, read from a
cache per timm version (:func:`timm_architectures`); timm itself is imported only to fill it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import json
import os
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from repdiag.core.errors import ConfigError, EncoderError

SOURCE_NAMES = ("timm", "open_clip", "torchvision", "hub", "checkpoint", "zoo", "python")
ZOO_FILES = ("model.safetensors", "meta.json")
PYTHON_TARGET = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".tar")

# Keys that only some sources read; any other source naming them is a config mistake.
SOURCE_KEYS = {
    "weights": ("checkpoint", "hub"),
    "repo": ("hub",),
    "state_dict_prefix": ("checkpoint", "hub"),
    "strict": ("checkpoint", "hub"),
}

# ``kwargs`` reach the library's factory. open_clip's factory has a fixed signature: only these
# architecture switches pass (its ``weights_only``, ``pretrained_*_path``, ``cache_dir``, ``jit``,
# ``precision`` ... would open, unpickle or download files the project's loader never checked).
OPEN_CLIP_KWARGS = (
    "force_quick_gelu",
    "force_custom_text",
    "force_patch_dropout",
    "force_image_size",
    "force_context_length",
    "output_dict",
    # model config overrides (open_clip's ``**model_kwargs``); their nested keys are checked below
    "embed_dim",
    "vision_cfg",
    "text_cfg",
    "quick_gelu",
    "init_logit_scale",
    "init_logit_bias",
    "nonscalar_logit_scale",
)
# timm, torchvision, checkpoint and hub factories take model-specific keywords: a keyword (at any
# depth) with one of these words in its name is a weights, file, download or unpickling switch and
# is refused. ``python`` entries are code by design and not checked.
WEIGHTS_WORDS = frozenset(
    {"pretrained", "pretrain", "checkpoint", "ckpt", "weights", "file", "url", "hub", "cache",
     "pickle", "jit", "load", "state", "dict", "download"}
)  # fmt: skip


def weights_kwargs(value: Any, where: str) -> list[str]:
    """The dotted paths of every keyword (at any depth) that names a weights or file switch."""
    found = []
    if isinstance(value, Mapping):
        for name, inner in value.items():
            words = set(re.split(r"[^a-z0-9]+", str(name).lower()))
            if words & WEIGHTS_WORDS:
                found.append(f"{where}.{name}")
            found += weights_kwargs(inner, f"{where}.{name}")
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += weights_kwargs(inner, f"{where}[{i}]")
    return found


REMOTE_PREFIXES = ("hf-hub:", "local-dir:", "http:", "https:")


def remote_names(value: Any, where: str) -> list[str]:
    """The dotted paths of every string (at any depth) that names a hub, a folder or a URL."""
    if isinstance(value, str):
        return [where] if value.strip().lower().startswith(REMOTE_PREFIXES) else []
    if isinstance(value, Mapping):
        return [f for name, inner in value.items() for f in remote_names(inner, f"{where}.{name}")]
    if isinstance(value, list):
        return [f for i, inner in enumerate(value) for f in remote_names(inner, f"{where}[{i}]")]
    return []


def check_kwargs(key: str, entry: Mapping[str, Any]) -> None:
    """Refuse ``kwargs`` that would make a library open, unpickle or download weights itself."""
    source, kwargs = entry.get("source"), entry.get("kwargs") or {}
    where = f"models.{key}.kwargs"
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}: must be a mapping of keyword arguments")
    if source == "open_clip":
        bad = [f"{where}.{name}" for name in kwargs if name not in OPEN_CLIP_KWARGS]
        nested = [f for n, v in kwargs.items() for f in weights_kwargs(v, f"{where}.{n}")]
        remote = remote_names(kwargs, where)
        if not bad and remote:
            raise ConfigError(
                f"{remote[0]}: a model name with a hf-hub: or local-dir: prefix makes open_clip "
                "fetch a tower or read a config.json repdiag never checked; name a built-in "
                "architecture (timm_model_name: vit_base_patch16_224, ...)"
            )
        if not bad and nested:
            raise ConfigError(
                f"{nested[0]}: keyword arguments that load, cache, download or unpickle weights "
                "are refused; weights come only from `pretrained:`"
            )
        if bad:
            raise ConfigError(
                f"{bad[0]}: not a keyword open_clip entries may pass; allowed: "
                f"{list(OPEN_CLIP_KWARGS)}. Weights come only from `pretrained:` (a tag or a "
                "local file read by repdiag's own loader)"
            )
    elif source in ("timm", "torchvision", "checkpoint", "hub"):
        bad = weights_kwargs(kwargs, where)
        if bad:
            raise ConfigError(
                f"{bad[0]}: keyword arguments that load, cache, download or unpickle weights are "
                f"refused (the library would open a file repdiag never checked); give the weights "
                f"as models.{key}.pretrained or models.{key}.weights instead"
            )


def zoo_files(entry: Mapping[str, Any], zoo_dir: str | Path = "results/zoo") -> list[str]:
    """The zoo checkpoint files an entry reads (``[]`` unless ``source: zoo``)."""
    if entry.get("source") != "zoo":
        return []
    return [str(Path(zoo_dir) / str(entry["id"]) / name) for name in ZOO_FILES]


def zoo_dir_of(files: Sequence[str | Path]) -> Path:
    """The zoo folder that :func:`zoo_files` placed ``files`` in (``results/zoo`` when there
    are none): the inverse a job needs to build its encoder from its own inputs."""
    return Path(files[0]).parent.parent if files else Path("results/zoo")


CACHE_ENV = "REPDIAG_CACHE_DIR"


def cache_dir() -> Path:
    """``$REPDIAG_CACHE_DIR``, else ``$XDG_CACHE_HOME/repdiag``, else ``~/.cache/repdiag``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "repdiag"


def timm_architectures() -> frozenset[str]:
    """timm's architecture names (``timm.list_models()``), cached on disk per timm version.

    Importing timm takes seconds (it imports torch and torchvision) and the Snakefile checks the
    names on every parse, so the list is kept in ``cache_dir() / "timm-<version>.json"``,
    written atomically; a missing, unreadable or malformed file is rebuilt, and an unwritable
    cache folder only costs the import. A name the cache wrongly admitted would still be
    refused by timm when the job builds the model.
    """
    path = cache_dir() / f"timm-{importlib.metadata.version('timm')}.json"
    try:
        names = json.loads(path.read_text())
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            return frozenset(names)
    except (OSError, ValueError):
        pass
    import timm

    names = timm.list_models()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(names))
        partial.replace(path)
    except OSError:
        pass
    return frozenset(names)


def is_timm_architecture(name: str) -> bool:
    """``timm.is_model(name)``: the architecture part, before any ``.pretrained_tag``, is known."""
    return name.split(".", 1)[0] in timm_architectures()


def check_timm_name(where: str, name: str) -> None:
    """Refuse a timm architecture name timm does not know, naming the key ``where``."""
    if not is_timm_architecture(name):
        base = name.split(".")[0]
        close = difflib.get_close_matches(base, sorted(timm_architectures()), n=5, cutoff=0.6)
        raise ConfigError(
            f"{where}: {name!r} is not a timm model"
            + (f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()")
        )


def check_entry(key: str, entry: Mapping[str, Any], *, check_names: bool = True) -> None:
    """Raise ConfigError naming ``models.<key>.<field>`` for what the JSON schema cannot check."""
    source = entry.get("source")
    if source not in SOURCE_NAMES:
        raise ConfigError(
            f"models.{key}.source: unknown source {source!r}; choose one of {SOURCE_NAMES}"
        )
    check_kwargs(key, entry)
    for field, sources in SOURCE_KEYS.items():
        if entry.get(field) not in (None, "", True) and source not in sources:
            raise ConfigError(
                f"models.{key}.{field} is only read by sources {list(sources)}, not {source!r}"
                + (
                    "; timm and open_clip take a weights file as `pretrained:`"
                    if field == "weights"
                    else ""
                )
            )
    if source == "python" and not PYTHON_TARGET.fullmatch(str(entry.get("id", ""))):
        raise ConfigError(
            f"models.{key}.id: {entry.get('id')!r} must be 'package.module:callable' for source python"
        )
    if source == "checkpoint":
        weights = entry.get("weights")
        if not weights:
            raise ConfigError(f"models.{key}.weights: source checkpoint needs a .safetensors file")
        if not str(weights).endswith(".safetensors"):
            raise ConfigError(
                f"models.{key}.weights: {weights!r} is not a .safetensors file; pickle checkpoints "
                "are refused: convert it with safetensors.torch.save_file(state_dict, path)"
            )
    if source == "hub":
        if not entry.get("repo"):
            raise ConfigError(f"models.{key}.repo: source hub needs a local torch.hub directory")
        if entry.get("pretrained") not in (None, False):
            raise ConfigError(
                f"models.{key}.pretrained: hub entry points are built with pretrained=False (their "
                f"own loaders unpickle downloads); give the weights file as models.{key}.weights"
            )
    if source == "torchvision" and entry.get("pretrained") is True:
        raise ConfigError(
            f"models.{key}.pretrained: torchvision takes a weights enum name (e.g. IMAGENET1K_V1) "
            "or a local weights file, not true"
        )
    if check_names and source in ("timm", "checkpoint"):
        check_timm_name(f"models.{key}.id", str(entry["id"]))


def is_local_path(value: str) -> bool:
    """Whether a ``pretrained`` string names a local file rather than a tag or enum name."""
    return "/" in value or "\\" in value or Path(value).suffix in (".safetensors", *PICKLE_SUFFIXES)


def model_error(key: str, message: str) -> EncoderError:
    """The error of model ``key``: ``model '<key>': <message>``."""
    return EncoderError(f"model {key!r}: {message}")


def _is_pickle(path: Path, head: bytes) -> bool:
    """torch.save zip archives, raw pickles (protocol 2-5) and the usual pickle suffixes."""
    zip_archive = head[:4] == b"PK\x03\x04"
    raw_pickle = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    return zip_archive or raw_pickle or path.suffix.lower() in PICKLE_SUFFIXES


def check_safetensors(path: str | Path, key: str) -> Path:
    """Refuse a missing, pickle or malformed file before anything reads it (header-only check)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_file():  # a device, a pipe or a folder: never read
        raise model_error(
            key, f"weights file {path} is not a regular file; give a .safetensors file"
        )
    if not path.is_file():
        raise model_error(
            key,
            f"weights file {path} does not exist; check the path (or run the rule that writes it)",
        )
    with open(path, "rb") as handle:
        head = handle.read(16)
    if _is_pickle(path, head):
        raise model_error(
            key,
            f"{path} is a pickle (torch.save) file; it is refused without being unpickled. Convert it "
            "once where you trust it: safetensors.torch.save_file(torch.load(f, weights_only=True), "
            "'model.safetensors')",
        )
    size = path.stat().st_size
    header_len = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    if header_len < 2 or 8 + header_len > size or head[8:9] != b"{":
        raise model_error(
            key, f"{path} is not a valid safetensors file (truncated or corrupt header)"
        )
    return path


def model_files(key: str, entry: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The local files and folders an entry's encoder reads: ``(dotted key, path, "file"|"dir")``.

    Zoo checkpoints are workflow outputs and not listed (see :func:`zoo_files`).
    """
    source = entry.get("source")
    files = []
    if source in ("checkpoint", "hub") and entry.get("weights"):
        files.append((f"models.{key}.weights", str(entry["weights"]), "file"))
    if source == "hub" and entry.get("repo"):
        files.append((f"models.{key}.repo", str(entry["repo"]), "dir"))
    pretrained = entry.get("pretrained")
    if isinstance(pretrained, str) and pretrained:
        if source == "timm" or (
            source in ("open_clip", "torchvision") and is_local_path(pretrained)
        ):
            files.append((f"models.{key}.pretrained", pretrained, "file"))
    return files


def check_model_files(config: Mapping[str, Any], models: Iterable[str] | None = None) -> None:
    """Every weights file and hub folder of ``models`` exists, and a ``checkpoint`` entry's file is
    safetensors, not a pickle (its header only, :func:`check_safetensors`): part of a real run's
    ``onstart`` check, :func:`repdiag.encoders.available.check_weights_available`.

    ``models``: the keys to check (default: all). Kept out of :func:`check_models` so that a dry
    run plans a config whose weights live on another machine (``config/paper.yaml``);
    ``rules/common.smk`` runs it before the first job, on the models that have jobs to run.
    """
    entries = config.get("models") or {}
    for key in entries if models is None else [m for m in entries if m in set(models)]:
        entry = entries[key]
        for where, path, kind in model_files(key, entry):
            local = Path(path).expanduser()
            if kind == "dir" and not (local / "hubconf.py").is_file():
                raise ConfigError(
                    f"{where}: {path} is not a local torch.hub directory (no "
                    f"{local / 'hubconf.py'}); clone the hub repository there or fix {where}"
                )
            if kind == "file" and local.exists() and not local.is_file():
                raise ConfigError(
                    f"{where}: {path} is not a regular file (a device, pipe or folder is never "
                    f"read as weights); give a weights file or fix {where}"
                )
            if kind == "file" and not local.is_file():
                raise ConfigError(
                    f"{where}: the weights file {path} does not exist; put it there or fix {where} "
                    "(relative paths are relative to the workflow directory)"
                )
            if kind == "file" and entry.get("source") == "checkpoint":
                check_safetensors(local, key)  # a pickle is refused here, before any job


def check_embeddings_config(config: Mapping[str, Any]) -> None:
    """``embeddings.folder``, when set, is an existing folder (registered in repdiag.core.config)."""
    folder = (config.get("embeddings") or {}).get("folder")
    if folder and not Path(folder).expanduser().is_dir():
        raise ConfigError(
            f"embeddings.folder: {folder} is not a folder; give a folder of images (relative "
            "paths are relative to the workflow directory) or set embeddings.folder: null"
        )


def check_models(config: MutableMapping[str, Any]) -> None:
    """Semantic checks of every model entry, and the inherited pooling default.

    An entry without ``pooling`` takes ``embeddings.pooling`` here, so that every stage that builds
    the encoder from its entry (extraction, Jacobians) taps the same vectors and the entry alone
    decides what that model's jobs depend on. Zoo entries keep ``pooling: null``: they use the
    pooling they were trained with (``meta.json``).
    """
    default_pooling = (config.get("embeddings") or {}).get("pooling", "cls")
    for key, entry in (config.get("models") or {}).items():
        check_entry(key, entry)
        if entry.get("pooling") is None and entry.get("source") != "zoo":
            entry["pooling"] = default_pooling
