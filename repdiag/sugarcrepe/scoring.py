"""SugarCrepe scoring and zero-shot accuracy of image-text models (open_clip, or python modules).

SugarCrepe (Hsieh et al. 2023) asks whether a model prefers an image's true caption to a hard
negative. With unit embeddings f(image) and g(text), an example is correct when

    cos(f(I), g(T+)) > cos(f(I), g(T-))        (strict: a tie counts as wrong)

and a category's accuracy is the fraction of its examples that are correct, with the Wilson 95%
interval (:func:`repdiag.common.intervals.wilson_interval`). ``overall`` pools every example;
``macro`` is the mean of the category accuracies, with the normal interval of a mean of
independent proportions, sqrt(sum_k p_k (1 - p_k) / n_k) / K.

Zero-shot accuracy (Radford et al. 2021): each class is the unit mean of the unit text embeddings
of its prompts (``templates`` filled with the class name); an image is classified as the class of
highest cosine similarity; top-1 accuracy with the Wilson interval.

Image-text models: ``source: open_clip`` entries are built whole (image and text towers) from the
same fields as :mod:`repdiag.encoders.sources` (``id``, ``pretrained``, ``kwargs``,
``preprocess``), with open_clip's own tokenizer and evaluation transform; ``source: python`` entries
must return a module with ``encode_image(x)``, ``encode_text(tokens)`` and ``tokenize(texts)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import ndtri
from torch import nn

from repdiag.common.intervals import WILSON, wilson_interval
from repdiag.core.errors import ConfigError, EncoderError
from repdiag.core.runtime import Progress
from repdiag.encoders.preprocess import Preprocess, from_open_clip
from repdiag.sugarcrepe.data import (
    CATEGORIES,
    Example,
    LabelledFolder,
    ScoringSettings,
    check_images,
    labelled_folder,
    load_examples,
    open_rgb,
)

log = logging.getLogger(__name__)

ZERO_SHOT_KEY = "zero_shot_accuracy"
OPEN_CLIP_INTERPOLATIONS = ("bicubic", "bilinear")


def _fail(key: str, message: str) -> EncoderError:
    return EncoderError(f"model {key!r}: {message}")


@dataclass(eq=False)
class ImageTextModel:
    """An image tower and a text tower that embed into one space, with their input pipelines."""

    key: str
    model: nn.Module
    tokenize: Callable[[list[str]], Any]
    transform: Callable[[Any], torch.Tensor]  # PIL image -> (3, S, S) float
    preprocess: Preprocess
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def to(self, device: torch.device | str) -> ImageTextModel:
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    @torch.no_grad()
    def encode_images(self, images: Sequence[Any]) -> torch.Tensor:
        """Unit image embeddings (N, D), float32 on the CPU, of PIL images."""
        x = torch.stack([self.transform(image) for image in images]).to(self.device)
        return F.normalize(self.model.encode_image(x).float(), dim=-1).cpu()

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit text embeddings (N, D), float32 on the CPU."""
        tokens = self.tokenize(list(texts))
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.to(self.device)
        return F.normalize(self.model.encode_text(tokens).float(), dim=-1).cpu()


def open_clip_transform(preprocess: Preprocess, resize_mode: str = "shortest") -> Callable:
    """open_clip's evaluation transform (resize, centre crop, normalise) for ``preprocess``."""
    import open_clip

    interpolation = preprocess.interpolation
    if interpolation not in OPEN_CLIP_INTERPOLATIONS:
        log.warning("open_clip's transform has no %s interpolation: using bilinear", interpolation)
        interpolation = "bilinear"
    return open_clip.image_transform(
        preprocess.input_size,
        is_train=False,
        mean=preprocess.mean,
        std=preprocess.std,
        resize_mode=resize_mode,
        interpolation=interpolation,
    )


def _open_clip_model(key: str, entry: Mapping[str, Any], seed: int) -> ImageTextModel:
    """The whole open_clip model (both towers), as the encoder registry builds its image tower."""
    import open_clip

    from repdiag.encoders.sources.open_clip import create_open_clip, resolve_open_clip_pretrained

    name, kwargs = str(entry["id"]), dict(entry.get("kwargs") or {})
    if name not in open_clip.list_models():
        raise _fail(key, f"{name!r} is not an open_clip model; see open_clip.list_models()")
    pretrained = entry.get("pretrained") or None
    if pretrained is True:
        raise _fail(
            key, "open_clip needs pretrained: a tag (e.g. openai) or a local file, not true"
        )
    pretrained = resolve_open_clip_pretrained(key, name, pretrained)
    try:
        with torch.random.fork_rng(devices=[]):  # random weights are a function of the seed
            torch.manual_seed(seed)
            model = create_open_clip(key, name, pretrained, kwargs)
        tokenizer = open_clip.get_tokenizer(name)
    except EncoderError:
        raise
    except Exception as err:  # open_clip/HF raise RuntimeError/ValueError/OSError/TypeError
        raise _fail(
            key,
            f"open_clip could not build {name!r} or its tokenizer ({type(err).__name__}: {err}); "
            "tokenizers from Hugging Face must be in the local cache",
        ) from err
    cfg = open_clip.get_model_preprocess_cfg(model)
    preprocess = from_open_clip(cfg).updated(entry.get("preprocess"))
    transform = open_clip_transform(preprocess, cfg.get("resize_mode", "shortest"))
    return ImageTextModel(key, model.eval(), tokenizer, transform, preprocess)


def _python_model(key: str, entry: Mapping[str, Any]) -> ImageTextModel:
    """A ``package.module:callable`` module exposing ``encode_image``, ``encode_text``, ``tokenize``."""
    from repdiag.encoders.sources import SOURCES, BuildOptions

    built = SOURCES.get("python")(key, entry, BuildOptions(Path("results/zoo")))
    model = built.model
    lacking = [
        name
        for name in ("encode_image", "encode_text", "tokenize")
        if not callable(getattr(model, name, None))
    ]
    if lacking:
        raise _fail(
            key,
            f"{entry['id']} returned a {type(model).__name__} without {lacking}; an image-text "
            "model needs encode_image(x), encode_text(tokens) and tokenize(texts)",
        )
    preprocess = built.preprocess.updated(entry.get("preprocess"))
    return ImageTextModel(
        key, model.eval(), model.tokenize, open_clip_transform(preprocess), preprocess
    )


def build_image_text_model(key: str, entry: Mapping[str, Any], *, seed: int) -> ImageTextModel:
    """The image-text model of config entry ``models.<key>`` (frozen, eval mode, on the CPU).

    ``seed`` fixes random initial weights (``pretrained`` unset); it does not touch the caller's RNG.
    """
    from repdiag.encoders.entries import check_entry

    try:
        check_entry(key, entry, check_names=False)
    except ConfigError as err:
        raise _fail(key, str(err)) from None
    source = entry.get("source")
    if source == "open_clip":
        model = _open_clip_model(key, entry, seed)
    elif source == "python":
        model = _python_model(key, entry)
    else:
        raise _fail(
            key,
            f"source {source!r} has no text tower; SugarCrepe scores open_clip models and python "
            "modules with encode_image/encode_text/tokenize",
        )
    model.model.requires_grad_(False)
    return model


# --------------------------------------------------------------------------- embeddings


def image_embeddings(
    model: ImageTextModel, paths: Sequence[str | Path], batch_size: int, what: str = "images"
) -> np.ndarray:
    """Unit embeddings (N, D) float32 of the image files ``paths``, ``batch_size`` at a time."""
    progress = Progress(len(paths), f"{model.key}: {what}")
    chunks = []
    for start in range(0, len(paths), batch_size):
        batch = [open_rgb(path) for path in paths[start : start + batch_size]]
        chunks.append(model.encode_images(batch).numpy())
        progress.update(len(batch))
    return _checked(np.concatenate(chunks), model.key, what)


def text_embeddings(model: ImageTextModel, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """Unit embeddings (N, D) float32 of ``texts``, ``batch_size`` at a time."""
    chunks = [
        model.encode_texts(texts[start : start + batch_size]).numpy()
        for start in range(0, len(texts), batch_size)
    ]
    return _checked(np.concatenate(chunks), model.key, "captions")


def _checked(values: np.ndarray, key: str, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        raise _fail(key, f"non-finite embeddings of the {what}; check the weights and the inputs")
    return values


# --------------------------------------------------------------------------- SugarCrepe


@dataclass(frozen=True)
class ExampleScores:
    """Per example: category, cos(image, caption) and cos(image, negative caption)."""

    categories: np.ndarray
    positive: np.ndarray
    negative: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        return self.positive > self.negative


def score_examples(
    model: ImageTextModel,
    examples: Sequence[Example],
    images: str | Path,
    batch_size: int,
) -> ExampleScores:
    """Cosine similarity of each example's image with its caption and its negative caption.

    Each distinct image and each distinct caption is embedded once.
    """
    folder = check_images(images, [e.filename for e in examples])
    filenames = sorted({e.filename for e in examples})
    texts = sorted({e.caption for e in examples} | {e.negative_caption for e in examples})
    image_index = {name: i for i, name in enumerate(filenames)}
    text_index = {text: i for i, text in enumerate(texts)}
    image_emb = image_embeddings(model, [folder / name for name in filenames], batch_size)
    text_emb = text_embeddings(model, texts, batch_size)
    rows = np.array([image_index[e.filename] for e in examples])

    def cosine(column: str) -> np.ndarray:
        cols = np.array([text_index[getattr(e, column)] for e in examples])
        return np.einsum("nd,nd->n", image_emb[rows], text_emb[cols]).astype(np.float64)

    return ExampleScores(
        categories=np.array([e.category for e in examples]),
        positive=cosine("caption"),
        negative=cosine("negative_caption"),
    )


def proportion(hits: int, n: int, confidence: float = 0.95) -> dict[str, Any]:
    """Accuracy hits / n with its Wilson interval."""
    low, high = wilson_interval(hits, n, confidence)
    return {
        "accuracy": hits / n,
        "ci_low": low,
        "ci_high": high,
        "n": int(n),
        "hits": int(hits),
        "ci_method": WILSON,
    }


def macro_average(
    per_category: Mapping[str, Mapping[str, Any]], confidence: float = 0.95
) -> dict[str, Any]:
    """Mean of the category accuracies, normal interval with se = sqrt(sum p(1-p)/n) / K."""
    accuracies = np.array([r["accuracy"] for r in per_category.values()])
    sizes = np.array([r["n"] for r in per_category.values()])
    mean = float(accuracies.mean())
    se = float(np.sqrt(np.sum(accuracies * (1 - accuracies) / sizes)) / len(accuracies))
    z = float(ndtri(0.5 + confidence / 2.0))
    return {
        "accuracy": mean,
        "ci_low": max(0.0, mean - z * se),
        "ci_high": min(1.0, mean + z * se),
        "n": int(sizes.sum()),
        "hits": int(sum(r["hits"] for r in per_category.values())),
        "ci_method": "normal",
    }


def accuracy_by_category(scores: ExampleScores, confidence: float = 0.95) -> dict[str, Any]:
    """``{"categories": {category: proportion}, "overall": pooled, "macro": mean of categories}``."""
    correct = scores.correct
    present = [c for c in CATEGORIES if c in set(scores.categories)]
    present += sorted(set(scores.categories) - set(present))
    per_category = {
        c: proportion(
            int(correct[scores.categories == c].sum()),
            int((scores.categories == c).sum()),
            confidence,
        )
        for c in present
    }
    return {
        "categories": per_category,
        "overall": proportion(int(correct.sum()), len(correct), confidence),
        "macro": macro_average(per_category, confidence),
    }


# --------------------------------------------------------------------------- zero-shot


def zero_shot_classifier(
    model: ImageTextModel,
    class_names: Sequence[str],
    templates: Sequence[str],
    batch_size: int,
) -> np.ndarray:
    """Class weights (C, D): unit mean of the unit embeddings of each class's prompts."""
    prompts = [template.format(name) for name in class_names for template in templates]
    emb = text_embeddings(model, prompts, batch_size).reshape(len(class_names), len(templates), -1)
    mean = emb.mean(axis=1)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


def zero_shot_accuracy(
    model: ImageTextModel,
    folder: LabelledFolder,
    templates: Sequence[str],
    batch_size: int,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Top-1 zero-shot accuracy on a labelled folder, with its Wilson interval."""
    weights = zero_shot_classifier(model, folder.class_names, templates, batch_size)
    images = image_embeddings(model, folder.paths, batch_size, "zero-shot images")
    predicted = np.argmax(images @ weights.T, axis=1)
    hits = int((predicted == np.asarray(folder.labels)).sum())
    return proportion(hits, len(folder.labels), confidence) | {"n_classes": len(folder.class_names)}


def configured_zero_shot(entry: Mapping[str, Any]) -> float | None:
    """``models.<key>.covariates.zero_shot_accuracy`` when the config gives it."""
    value = (entry.get("covariates") or {}).get(ZERO_SHOT_KEY)
    return None if value is None else float(value)


# --------------------------------------------------------------------------- one model


def evaluate_model(
    key: str,
    entry: Mapping[str, Any],
    settings: ScoringSettings,
    *,
    device: torch.device | str,
    examples: Sequence[Example] | None = None,
) -> dict[str, Any]:
    """SugarCrepe accuracies and the zero-shot covariate of one model: the record of its JSON.

    ``examples`` skips reading the data. The covariate is computed when ``zero_shot.folder`` is
    set, else taken from the config.
    """
    start = time.perf_counter()
    categories = list(settings.categories)
    if examples is None:
        examples = load_examples(
            settings.root, settings.images, categories, settings.max_per_category
        )
    batch_size = settings.batch_size
    model = build_image_text_model(key, entry, seed=settings.seed).to(device)
    log.info("model %s: scoring %d SugarCrepe examples on %s", key, len(examples), device)
    scores = score_examples(model, examples, settings.images, batch_size)
    result = accuracy_by_category(scores)
    zero_shot = settings.zero_shot
    configured = configured_zero_shot(entry)
    if zero_shot.folder:
        folder = labelled_folder(zero_shot.folder, zero_shot.class_names, zero_shot.max_per_class)
        templates = list(zero_shot.templates)
        covariate = zero_shot_accuracy(model, folder, templates, batch_size)
        covariate |= {
            "source": "folder",
            "folder": str(zero_shot.folder),
            "n_templates": len(templates),
        }
    elif configured is not None:
        covariate = {"accuracy": configured, "source": "config"}
    else:
        covariate = {"accuracy": None, "source": "missing"}
    covariate["config_value"] = configured
    log.info(
        "model %s: SugarCrepe overall %.4f, macro %.4f, zero-shot %s (%s)",
        key,
        result["overall"]["accuracy"],
        result["macro"]["accuracy"],
        covariate["accuracy"],
        covariate["source"],
    )
    return {
        "model": key,
        "family": str(entry.get("family", "other")),
        "source": str(entry.get("source")),
        "id": str(entry.get("id")),
        "pretrained": entry.get("pretrained"),
        **result,
        "zero_shot": covariate,
        "n_examples": len(examples),
        "n_images": len({e.filename for e in examples}),
        "preprocess": model.preprocess.as_dict(),
        "device": str(device),
        "wall_time_s": round(time.perf_counter() - start, 3),
    }
