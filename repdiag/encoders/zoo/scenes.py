"""Seeded stream of synthetic multi-object scenes for pretraining the embedded zoo.

The scenes use the benchmark's renderer (:mod:`repdiag.common.render`) and by default its grid
(2 x 2), object size and jitter ranges, but their own content: every registered shape (the
benchmark's four plus five more), 2 to 4 objects, a palette of named colours of its own (no RGB
value of the benchmark's query or target palettes) with per-object colour noise, and grey
backgrounds. A pretraining image can therefore never be one of the evaluation images.

Each scene comes with

* a relational caption naming its objects in slot order, "red circle top left, blue square bottom
  right", for the vision-language objective (which by default uses the position-free
  :func:`bag_caption` instead, "blue square, red circle");
* labels for the supervised objective: ``slot_shape[b, s]`` is 0 for an empty slot and
  ``1 + k`` when ``shapes[k]`` sits in slot ``s``; ``slot_colour`` likewise for colour names.

With ``arrangement_groups = g > 1`` a batch comes in groups of ``g`` consecutive scenes that share
their objects' shapes, the colour, jitter and size of each occupied slot, and the background: only
which shape sits in which occupied slot differs (distinct permutations while there are enough).
Telling the scenes of a group apart, as instance discrimination must, then needs which shape is
where, i.e. binding; with ``g = 1`` every scene is drawn on its own.

Batch ``step`` is a pure function of ``(seed, step)`` (``numpy.random.default_rng([seed, step])``),
so the stream is reproducible, needs no storage and can resume at any step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from repdiag.common.render import SHAPES, Jitter, SceneObject, render_scenes
from repdiag.core.settings import schema_section

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (215, 38, 38),
    "orange": (250, 150, 30),
    "yellow": (240, 240, 60),
    "lime": (150, 230, 50),
    "green": (30, 150, 60),
    "teal": (20, 150, 140),
    "cyan": (60, 210, 250),
    "blue": (40, 80, 220),
    "purple": (120, 60, 200),
    "magenta": (220, 60, 200),
    "pink": (250, 160, 190),
    "brown": (140, 90, 40),
    "white": (235, 235, 235),
    "grey": (140, 140, 140),
}
"""Named pretraining colours (the caption words); none is an RGB of the benchmark palettes."""

ROW_WORDS = {1: ("",), 2: ("top", "bottom"), 3: ("top", "middle", "bottom")}
COL_WORDS = {1: ("",), 2: ("left", "right"), 3: ("left", "centre", "right")}


@dataclass(frozen=True)
class SceneSettings:
    """Generative settings of the pretraining scenes (the ``zoo.scenes`` config section and
    ``zoo.image_size``), built by :meth:`from_config`: every value from the config or the
    schema's default; ``arrangement_groups`` is a run's own (``zoo.objectives.<run>``, 1: every
    scene drawn on its own)."""

    image_size: int
    grid: tuple[int, int]
    min_objects: int
    max_objects: int
    shapes: tuple[str, ...]  # empty: every registered shape
    colours: tuple[str, ...]  # empty: every PALETTE colour
    colour_noise: int
    background_levels: tuple[int, ...]
    jitter: Jitter
    object_size: float
    supersample: int
    arrangement_groups: int  # scenes per group sharing all but the arrangement (1 = none)

    def __post_init__(self) -> None:
        if self.arrangement_groups < 1:
            raise ValueError(f"arrangement_groups must be >= 1, got {self.arrangement_groups}")
        object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
        object.__setattr__(self, "shapes", tuple(self.shapes) or tuple(SHAPES.names()))
        object.__setattr__(self, "colours", tuple(self.colours) or tuple(PALETTE))
        object.__setattr__(self, "background_levels", tuple(int(v) for v in self.background_levels))
        if not self.background_levels or not all(0 <= v <= 255 for v in self.background_levels):
            raise ValueError(
                f"background_levels must be grey levels in [0, 255], got {self.background_levels}"
            )
        if isinstance(self.jitter, Mapping):
            object.__setattr__(self, "jitter", Jitter(**self.jitter))
        for name in self.shapes:
            SHAPES.get(name)  # unknown names raise a RegistryError listing the known ones
        unknown = [c for c in self.colours if c not in PALETTE]
        if unknown:
            raise ValueError(f"unknown scene colours {unknown}; choose from {sorted(PALETTE)}")
        if not 1 <= self.min_objects <= self.max_objects <= self.n_slots:
            raise ValueError(
                f"need 1 <= min_objects ({self.min_objects}) <= max_objects ({self.max_objects}) "
                f"<= slots of the {self.grid[0]}x{self.grid[1]} grid ({self.n_slots})"
            )
        if self.object_size * (1.0 + self.jitter.scale) > 1.0 + 1e-12:
            raise ValueError(
                f"object_size * (1 + jitter.scale) = {self.object_size * (1 + self.jitter.scale):.3f} "
                "> 1: objects would leave their cells"
            )

    @property
    def n_slots(self) -> int:
        return self.grid[0] * self.grid[1]

    @classmethod
    def from_config(
        cls, section: Mapping[str, Any], image_size: int, *, arrangement_groups: int
    ) -> SceneSettings:
        """Build from a ``zoo.scenes`` mapping, ``zoo.image_size`` and a run's
        ``arrangement_groups``; a scene key the mapping leaves out takes the schema's default
        (:func:`repdiag.core.settings.schema_section`)."""
        keys = {
            "grid", "min_objects", "max_objects", "shapes", "colours", "colour_noise",
            "background_levels", "jitter", "object_size", "supersample",
        }  # fmt: skip
        values = schema_section("zoo.scenes") | dict(section)
        scenes = {k: v for k, v in values.items() if k in keys}
        return cls(image_size=image_size, arrangement_groups=arrangement_groups, **scenes)


@dataclass
class SceneBatch:
    """Images uint8 (B, H, W, 3), captions, and per-slot labels (0 = empty slot)."""

    images: np.ndarray
    captions: list[str]
    slot_shape: np.ndarray  # (B, n_slots) int64: 0 empty, 1 + index into SceneSettings.shapes
    slot_colour: np.ndarray  # (B, n_slots) int64: 0 empty, 1 + index into SceneSettings.colours


def slot_words(slot: int, grid: tuple[int, int]) -> str:
    """Position phrase of a slot: "top left", "centre", "bottom right" (rows/cols up to 3)."""
    rows, cols = grid
    row, col = divmod(slot, cols)
    row_word = ROW_WORDS[rows][row] if rows in ROW_WORDS else f"row{row}"
    col_word = COL_WORDS[cols][col] if cols in COL_WORDS else f"col{col}"
    if row_word == "middle" and col_word == "centre":
        return "centre"
    return " ".join(w for w in (row_word, col_word) if w)


def caption(objects: Sequence[tuple[str, str, int]], grid: tuple[int, int]) -> str:
    """Caption of ``(colour name, shape, slot)`` triples in slot order, comma separated."""
    ordered = sorted(objects, key=lambda item: item[2])
    return ", ".join(
        f"{colour} {shape} {slot_words(slot, grid)}".strip() for colour, shape, slot in ordered
    )


def bag_caption(slot_shape: Sequence[int], slot_colour: Sequence[int], cfg: SceneSettings) -> str:
    """Position-free caption of one scene from its labels (0 = empty, 1 + index otherwise): its
    objects as "colour shape" in alphabetical order, so the word order says nothing of where
    they are: "blue circle, red square"."""
    objects = sorted(
        f"{cfg.colours[c - 1]} {cfg.shapes[s - 1]}"
        for s, c in zip(slot_shape, slot_colour, strict=True)
        if s > 0
    )
    return ", ".join(objects)


def caption_vocabulary(cfg: SceneSettings) -> list[str]:
    """Every word a caption of ``cfg`` can contain (for the CLIP text tokenizer), sorted."""
    words = set(cfg.colours) | set(cfg.shapes) | {","}
    for slot in range(cfg.n_slots):
        words.update(slot_words(slot, cfg.grid).split())
    return sorted(words)


def sample_scenes(
    cfg: SceneSettings, rng: np.random.Generator, n: int
) -> tuple[list[list[SceneObject]], SceneBatch]:
    """Draw ``n`` scenes: objects for the renderer plus captions and labels (images left empty)."""
    scenes, captions = [], []
    slot_shape = np.zeros((n, cfg.n_slots), dtype=np.int64)
    slot_colour = np.zeros((n, cfg.n_slots), dtype=np.int64)
    for b in range(n):
        count = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
        slots = rng.choice(cfg.n_slots, size=count, replace=False)
        shape_idx = rng.integers(0, len(cfg.shapes), size=count)
        colour_idx = rng.integers(0, len(cfg.colours), size=count)
        noise = rng.integers(-cfg.colour_noise, cfg.colour_noise + 1, size=(count, 3))
        jitter = cfg.jitter.sample(rng, count)
        objects, words = [], []
        for k in range(count):
            name = cfg.colours[colour_idx[k]]
            rgb = np.clip(np.asarray(PALETTE[name]) + noise[k], 0, 255)
            objects.append(
                SceneObject(
                    shape=cfg.shapes[shape_idx[k]],
                    slot=int(slots[k]),
                    colour=(int(rgb[0]), int(rgb[1]), int(rgb[2])),
                    dx=float(jitter["dx"][k]),
                    dy=float(jitter["dy"][k]),
                    scale=float(jitter["scale"][k]),
                    rotation=float(jitter["rotation"][k]),
                )
            )
            words.append((name, cfg.shapes[shape_idx[k]], int(slots[k])))
            slot_shape[b, slots[k]] = shape_idx[k] + 1
            slot_colour[b, slots[k]] = colour_idx[k] + 1
        scenes.append(objects)
        captions.append(caption(words, cfg.grid))
    empty = np.zeros((n, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    return scenes, SceneBatch(empty, captions, slot_shape, slot_colour)


def _permutations(rng: np.random.Generator, count: int, members: int) -> list[np.ndarray]:
    """``members`` orderings of ``count`` objects: the identity first, then distinct random
    permutations while there are any left (then repeats)."""
    orders = [np.arange(count)]
    seen = {tuple(orders[0])}
    while len(orders) < members:
        order = rng.permutation(count)
        if tuple(order) not in seen or len(seen) == math.factorial(count):
            seen.add(tuple(order))
            orders.append(order)
    return orders


def sample_arrangement_groups(
    cfg: SceneSettings, rng: np.random.Generator, n: int
) -> tuple[list[list[SceneObject]], SceneBatch, np.ndarray]:
    """Draw ``n`` scenes in groups of ``cfg.arrangement_groups`` (the last one may be short):
    each group draws one scene (distinct shapes, so every permutation is a new arrangement) and
    its members permute the shapes over the occupied slots, keeping every slot's colour, jitter
    and the background. Returns the scenes, labels and captions, and the background levels."""
    scenes, captions, backgrounds = [], [], []
    slot_shape = np.zeros((n, cfg.n_slots), dtype=np.int64)
    slot_colour = np.zeros((n, cfg.n_slots), dtype=np.int64)
    levels = np.asarray(cfg.background_levels)
    for start in range(0, n, cfg.arrangement_groups):
        members = min(cfg.arrangement_groups, n - start)
        count = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
        slots = rng.choice(cfg.n_slots, size=count, replace=False)
        shape_idx = rng.choice(len(cfg.shapes), size=min(count, len(cfg.shapes)), replace=False)
        shape_idx = np.resize(shape_idx, count)
        colour_idx = rng.integers(0, len(cfg.colours), size=count)
        noise = rng.integers(-cfg.colour_noise, cfg.colour_noise + 1, size=(count, 3))
        jitter = cfg.jitter.sample(rng, count)
        level = levels[rng.integers(0, len(levels))]
        for m, order in enumerate(_permutations(rng, count, members)):
            b = start + m
            objects, words = [], []
            for k in range(count):
                name = cfg.colours[colour_idx[k]]
                rgb = np.clip(np.asarray(PALETTE[name]) + noise[k], 0, 255)
                shape = cfg.shapes[shape_idx[order[k]]]
                objects.append(
                    SceneObject(
                        shape=shape,
                        slot=int(slots[k]),
                        colour=(int(rgb[0]), int(rgb[1]), int(rgb[2])),
                        dx=float(jitter["dx"][k]),
                        dy=float(jitter["dy"][k]),
                        scale=float(jitter["scale"][k]),
                        rotation=float(jitter["rotation"][k]),
                    )
                )
                words.append((name, shape, int(slots[k])))
                slot_shape[b, slots[k]] = shape_idx[order[k]] + 1
                slot_colour[b, slots[k]] = colour_idx[k] + 1
            scenes.append(objects)
            captions.append(caption(words, cfg.grid))
            backgrounds.append(level)
    empty = np.zeros((n, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    return scenes, SceneBatch(empty, captions, slot_shape, slot_colour), np.asarray(backgrounds)


def scene_batch(cfg: SceneSettings, seed: int, step: int, batch_size: int) -> SceneBatch:
    """Batch ``step`` of the stream ``seed``: a pure function of its arguments."""
    rng = np.random.default_rng([int(seed), int(step)])
    if cfg.arrangement_groups > 1:
        scenes, batch, backgrounds = sample_arrangement_groups(cfg, rng, batch_size)
    else:
        scenes, batch = sample_scenes(cfg, rng, batch_size)
        backgrounds = np.asarray(cfg.background_levels)[
            rng.integers(0, len(cfg.background_levels), batch_size)
        ]
    for level in np.unique(backgrounds):
        members = np.flatnonzero(backgrounds == level)
        batch.images[members] = render_scenes(
            [scenes[i] for i in members],
            cfg.image_size,
            cfg.grid,
            (int(level),) * 3,
            object_size=cfg.object_size,
            supersample=cfg.supersample,
        )
    return batch


def channel_statistics(
    cfg: SceneSettings, seed: int, n_images: int = 512
) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of pixels in [0, 1] over the stream's first
    ``n_images`` scenes (rounded to 3 decimals): the input normalisation of the zoo encoders."""
    images = scene_batch(cfg, seed, 0, n_images).images.reshape(-1, 3) / 255.0
    return [round(float(v), 3) for v in images.mean(axis=0)], [
        round(float(v), 3) for v in images.std(axis=0)
    ]
