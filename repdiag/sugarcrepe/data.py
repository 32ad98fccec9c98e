"""SugarCrepe (Hsieh et al. 2023): COCO val2017 images with a positive and a hard negative caption.

SugarCrepe's data are seven JSON files, one per category (``replace_obj``, ``replace_att``,
``replace_rel``, ``swap_obj``, ``swap_att``, ``add_obj``, ``add_att``), each a dict keyed by example
id::

    {"0": {"filename": "000000391895.jpg", "caption": "...", "negative_caption": "..."}, ...}

``caption`` is the true caption of the COCO val2017 image ``filename``; ``negative_caption`` is the
hard negative made by replacing, swapping or adding an object, attribute or relation. Nothing is
downloaded: the files are read from the local paths ``sugarcrepe.root`` and ``sugarcrepe.images``.

The zero-shot covariate reads a labelled image folder, ``<folder>/<class directory>/<image>``
(the torchvision ``ImageFolder`` layout), with class names from the directory names or a mapping.

This module stays free of torch (the Snakefile imports it on every parse); PIL is imported lazily.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from repdiag.common.images import list_images
from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig

CATEGORIES = (
    "replace_obj",
    "replace_att",
    "replace_rel",
    "swap_obj",
    "swap_att",
    "add_obj",
    "add_att",
)
TEXT_SOURCES = ("open_clip", "python")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
FIELDS = ("filename", "caption", "negative_caption")
DATA_URL = "https://github.com/RAIVNLab/sugar-crepe/tree/main/data"
COCO_URL = "http://images.cocodataset.org/zips/val2017.zip"


@dataclass(frozen=True)
class ZeroShotSettings(FromConfig):
    """``sugarcrepe.zero_shot``: the labelled folder of the zero-shot covariate (None: the
    model's ``covariates.zero_shot_accuracy`` instead), its class names, prompts and the cap of
    images per class."""

    SECTION: ClassVar[str] = "sugarcrepe.zero_shot"
    folder: str | None
    class_names: str | Mapping[str, str] | None
    templates: Sequence[str]
    max_per_class: int | None


@dataclass(frozen=True)
class ScoringSettings(FromConfig):
    """What one model's scoring reads of ``sugarcrepe`` (rule sugarcrepe_score's params): the
    data, the categories and their cap, the batch size, the seed of random initial weights
    (resolved: the rule puts the global seed in for ``null``) and the zero-shot covariate."""

    SECTION: ClassVar[str] = "sugarcrepe"
    root: str | None
    images: str | None
    categories: Sequence[str]
    max_per_category: int | None
    batch_size: int
    seed: int | None
    zero_shot: ZeroShotSettings

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int):
            raise ConfigError(
                f"sugarcrepe.seed is {self.seed!r}: scoring needs it resolved to an integer "
                "(the workflow puts the global seed in for null; pass one)"
            )


def download_help(what: str) -> str:
    """What to download and where to put it, for error messages."""
    if what == "images":
        return (
            f"download COCO val2017 ({COCO_URL}, 5000 images, 788 MB), unzip it and set "
            "sugarcrepe.images to the val2017/ folder"
        )
    return (
        f"download SugarCrepe's JSON files ({', '.join(f'{c}.json' for c in CATEGORIES)}) from "
        f"{DATA_URL} into one folder and set sugarcrepe.root to it"
    )


@dataclass(frozen=True)
class Example:
    """One SugarCrepe example: an image, its caption and the hard negative caption."""

    category: str
    id: str
    filename: str
    caption: str
    negative_caption: str


def category_file(root: str | Path, category: str) -> Path:
    return Path(root) / f"{category}.json"


def sugarcrepe_files(root: str | Path | None, categories: Sequence[str]) -> list[str]:
    """The JSON files a scoring job reads (``[]`` when ``root`` is unset: the job then says why)."""
    if root is None:
        return []
    return [str(category_file(root, c)) for c in categories]


def read_category(path: str | Path, category: str, max_items: int | None = None) -> list[Example]:
    """The examples of one category file, in file order (the first ``max_items`` when given)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"SugarCrepe file {path} does not exist; {download_help('data')}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"SugarCrepe file {path} is not valid JSON ({err}); download it again"
        ) from err
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"SugarCrepe file {path}: expected a non-empty dict keyed by example id, "
            f"got {type(data).__name__} of length {len(data) if hasattr(data, '__len__') else '?'}"
        )
    examples = []
    for key, record in data.items():
        if not isinstance(record, dict) or not all(
            isinstance(record.get(f), str) and record.get(f) for f in FIELDS
        ):
            raise ConfigError(
                f"SugarCrepe file {path}, example {key!r}: needs non-empty string fields {FIELDS}"
            )
        examples.append(Example(category, str(key), *(record[f] for f in FIELDS)))
        if max_items is not None and len(examples) >= max_items:
            break
    return examples


def check_images(images: str | Path | None, filenames: Sequence[str]) -> Path:
    """The image folder, after checking that every referenced file is in it."""
    if images is None:
        raise ConfigError(f"sugarcrepe.images is not set; {download_help('images')}")
    folder = Path(images)
    if not folder.is_dir():
        raise ConfigError(f"sugarcrepe.images: {folder} is not a folder; {download_help('images')}")
    real = folder.resolve()
    outside = sorted({n for n in filenames if not (folder / n).resolve().is_relative_to(real)})
    if outside:
        raise ConfigError(
            f"sugarcrepe.images: {len(outside)} file names that SugarCrepe references lead "
            f"outside {folder}, e.g. {outside[:3]}; the data files were altered: download them again"
        )
    missing = sorted({name for name in filenames if not (folder / name).is_file()})
    if missing:
        raise ConfigError(
            f"sugarcrepe.images: {len(missing)} images that SugarCrepe references are not in "
            f"{folder}, e.g. {missing[:3]}; {download_help('images')}"
        )
    return folder


def load_examples(
    root: str | Path | None,
    images: str | Path | None,
    categories: Sequence[str] = CATEGORIES,
    max_per_category: int | None = None,
) -> list[Example]:
    """Every example of ``categories`` (category order, then file order), images checked."""
    if root is None:
        raise ConfigError(f"sugarcrepe.root is not set; {download_help('data')}")
    if not Path(root).is_dir():
        raise ConfigError(f"sugarcrepe.root: {root} is not a folder; {download_help('data')}")
    examples = [
        example
        for category in categories
        for example in read_category(category_file(root, category), category, max_per_category)
    ]
    check_images(images, [e.filename for e in examples])
    return examples


def open_rgb(path: str | Path, root: str | Path | None = None) -> Any:
    """The image at ``path`` as an RGB ``PIL.Image`` (fully read, file closed), its centre square.

    Read by :func:`repdiag.common.images.read_rgb`: a regular file inside ``root`` (default: its
    folder), within the pixel budget and side ratio (checked from the header), converted by mode,
    and cropped to its centre square before the model's own transform resizes it. open_clip's
    evaluation transform resizes the shorter side and centre-crops that square anyway; cropping
    first means a long thin image is never resized along its long side.
    """
    from repdiag.common.images import ImageError, ReadOptions, read_rgb

    try:
        return read_rgb(path, ReadOptions(root=root, square=True))
    except ImageError as err:
        raise ConfigError(str(err)) from err


# --------------------------------------------------------------------------- zero-shot folder


@dataclass(frozen=True)
class LabelledFolder:
    """Images of a class-per-directory folder: paths, class index per image, class names."""

    paths: list[Path]
    labels: list[int]
    class_names: list[str]
    class_dirs: list[str]


def read_class_names(class_names: str | Path | Mapping[str, str] | None) -> dict[str, str] | None:
    """A ``{directory: class name}`` mapping from a mapping, a JSON file, or None."""
    if class_names is None or isinstance(class_names, Mapping):
        return None if class_names is None else {str(k): str(v) for k, v in class_names.items()}
    path = Path(class_names)
    if not path.is_file():
        raise ConfigError(f"sugarcrepe.zero_shot.class_names: {path} does not exist")
    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"sugarcrepe.zero_shot.class_names: {path} is not valid JSON ({err})"
        ) from err
    if not isinstance(mapping, dict):
        raise ConfigError(
            f"sugarcrepe.zero_shot.class_names: {path} must hold a JSON object {{directory: name}}"
        )
    return {str(k): str(v) for k, v in mapping.items()}


def labelled_folder(
    folder: str | Path,
    class_names: str | Path | Mapping[str, str] | None = None,
    max_per_class: int | None = None,
) -> LabelledFolder:
    """Images under ``folder/<class dir>/`` (sorted; the first ``max_per_class`` of each class).

    A class's name is ``class_names[dir]`` when a mapping is given (every directory must be in
    it), else the directory name with underscores as spaces.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"sugarcrepe.zero_shot.folder: {folder} is not a folder")
    mapping = read_class_names(class_names)
    dirs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if len(dirs) < 2:
        raise ConfigError(
            f"sugarcrepe.zero_shot.folder: {folder} needs one sub-folder per class (at least 2), "
            f"found {len(dirs)}"
        )
    if mapping is not None:
        unnamed = [d for d in dirs if d not in mapping]
        if unnamed:
            raise ConfigError(
                f"sugarcrepe.zero_shot.class_names has no name for {len(unnamed)} class folders "
                f"of {folder}, e.g. {unnamed[:3]}"
            )
    paths, labels = [], []
    for index, name in enumerate(dirs):
        found = list_images(folder / name, IMAGE_SUFFIXES)[:max_per_class]
        if not found:
            raise ConfigError(
                f"sugarcrepe.zero_shot.folder: class folder {folder / name} has no images"
            )
        paths += found
        labels += [index] * len(found)
    names = [mapping[d] if mapping is not None else d.replace("_", " ") for d in dirs]
    return LabelledFolder(paths, labels, names, dirs)


# --------------------------------------------------------------------------- config


def scored_models(config: Mapping[str, Any]) -> list[str]:
    """Models scored on SugarCrepe: ``sugarcrepe.models``, or every ``open_clip`` model (config order)."""
    section = config.get("sugarcrepe") or {}
    models = config.get("models") or {}
    listed = section.get("models") or []
    if listed:
        return list(listed)
    return [key for key, entry in models.items() if entry.get("source") == "open_clip"]


def _check_paths(section: Mapping[str, Any]) -> None:
    root, images = section.get("root"), section.get("images")
    if root is None or not Path(root).is_dir():
        raise ConfigError(
            f"sugarcrepe.root: {root!r} is not a folder (sugarcrepe.enabled is true); "
            + download_help("data")
        )
    missing = [
        c for c in section.get("categories", CATEGORIES) if not category_file(root, c).is_file()
    ]
    if missing:
        raise ConfigError(
            f"sugarcrepe.root: {root} lacks {', '.join(f'{c}.json' for c in missing)}; "
            + download_help("data")
        )
    if images is None or not Path(images).is_dir():
        raise ConfigError(
            f"sugarcrepe.images: {images!r} is not a folder (sugarcrepe.enabled is true); "
            + download_help("images")
        )
    zero_shot = section.get("zero_shot") or {}
    if zero_shot.get("folder") is not None and not Path(zero_shot["folder"]).is_dir():
        raise ConfigError(f"sugarcrepe.zero_shot.folder: {zero_shot['folder']} is not a folder")
    names = zero_shot.get("class_names")
    if isinstance(names, str) and not Path(names).is_file():
        raise ConfigError(f"sugarcrepe.zero_shot.class_names: {names} does not exist")


def check_sugarcrepe_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``sugarcrepe`` (registered in ``repdiag.sugarcrepe.config_checks()``).

    Listed models must exist and have a text tower (source open_clip or python); when enabled, at
    least one model is scored and the data are where the config says.
    """
    section = config.get("sugarcrepe") or {}
    models = config.get("models") or {}
    for key in section.get("models") or []:
        if key not in models:
            raise ConfigError(f"sugarcrepe.models: {key!r} is not a key of models ({list(models)})")
        source = models[key].get("source")
        if source not in TEXT_SOURCES:
            raise ConfigError(
                f"sugarcrepe.models: {key!r} has source {source!r}, which has no text tower; "
                f"SugarCrepe scores sources {list(TEXT_SOURCES)}"
            )
    if not section.get("enabled", False):
        return
    if not scored_models(config):
        raise ConfigError(
            "sugarcrepe.models: sugarcrepe.enabled is true but no model has a text tower; add "
            "open_clip models to models or list python image-text models in sugarcrepe.models"
        )
    _check_paths(section)
