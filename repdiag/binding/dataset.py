"""The attribute-binding benchmark: query/candidate matching by shape-to-slot arrangement, and
balanced Same/Different pairs (the paper in ../shared/seeds/000 and 001, "Attribute Binding").

A scene's *arrangement* is the vector ``a`` over the grid's slots with ``a[s]`` the index of the
shape in slot ``s`` (-1 when empty); every scene shows ``n_objects`` distinct shapes. The task is
built so that only binding (which shape sits in which slot) can solve it:

* the ``n_candidates`` targets of a query with arrangement ``a`` are distinct permutations of the
  shapes *among the occupied slots of a*: every candidate has the query's occupied slots and its
  shape multiset, exactly one equals ``a``, at a uniformly random index. Occupancy, the set of
  shapes, their count and (the shapes having equal area, ``repdiag.common.render.SHAPE_AREA``) the
  foreground area per slot are the same across candidates up to the scale jitter;
* query objects take colours from the query palette, targets from a disjoint target palette,
  each scene drawn independently, so neither colour nor jitter says which candidate is correct;
* a Same/Different pair shows arrangement ``a`` (query palette) next to ``a`` itself (same) or
  another permutation of its shapes among the same occupied slots (different); exactly half the
  pairs are same.

The number of arrangements a query can be confused with is the number of distinct permutations
of its shapes over its occupied slots, ``n_objects!`` for distinct shapes; a full grid
(``n_objects`` = slots) makes occupancy constant over the whole dataset.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xarray as xr

from repdiag.common.render import RGB, SHAPES, Jitter, SceneObject, render_scenes
from repdiag.core.errors import ConfigError
from repdiag.core.settings import schema_section

KEY = "datasets.binding"
MIN_CELL_PX = 8
CHUNK_BYTES = 8 << 20
CHANNELS = ("r", "g", "b")


CONTRACT: dict[str, tuple[str, tuple[str, ...]]] = {
    "query_image": ("uint8", ("query", "y", "x", "channel")),
    "candidate_image": ("uint8", ("query", "candidate", "y", "x", "channel")),
    "correct_index": ("int64", ("query",)),
    "pair_image": ("uint8", ("pair", "member", "y", "x", "channel")),
    "pair_same": ("int8", ("pair",)),
    "query_shape": ("int8", ("query", "slot")),
    "candidate_shape": ("int8", ("query", "candidate", "slot")),
    "pair_shape": ("int8", ("pair", "member", "slot")),
    "query_colour": ("uint8", ("query", "slot", "channel")),
    "candidate_colour": ("uint8", ("query", "candidate", "slot", "channel")),
    "pair_colour": ("uint8", ("pair", "member", "slot", "channel")),
}
"""dtype and dims of the store's arrays, checked whenever it is read (docs/contracts.md is
generated from it and :data:`MEANING`: ``python -m repdiag.contracts``)."""

MEANING: dict[str, str] = {
    "query_image": "query scenes, query palette",
    "candidate_image": "candidates, target palette",
    "correct_index": "index of the candidate with the query's arrangement",
    "pair_image": "Same/Different pairs, member = 0, 1",
    "pair_same": "1 same arrangement, 0 different",
    "query_shape": "index into `shape_name` of the shape in each slot, -1 empty",
    "candidate_shape": "the same for each candidate",
    "pair_shape": "the same for each pair member",
    "query_colour": "RGB of the object in each slot",
    "candidate_colour": "the same for each candidate",
    "pair_colour": "the same for each pair member",
}
"""What each array of :data:`CONTRACT` holds."""


def n_arrangements(shape_counts: Sequence[int], n_slots: int) -> int:
    """Distinct placements of a shape multiset in ``n_slots`` slots (one object per slot):
    ``n_slots! / (prod_i c_i! * (n_slots - sum_i c_i)!)``. With ``n_slots = sum_i c_i`` (the
    occupied slots of a scene) this is the number of binding alternatives, ``n! / prod_i c_i!``."""
    n_objects = sum(shape_counts)
    if n_objects > n_slots:
        return 0
    denominator = math.factorial(n_slots - n_objects)
    for count in shape_counts:
        denominator *= math.factorial(count)
    return math.factorial(n_slots) // denominator


def _rgb_tuple(value: Sequence[int]) -> RGB:
    red, green, blue = (int(c) for c in value)
    return red, green, blue


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively: the JSON/YAML form of a value."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _grid(value: Sequence[int]) -> tuple[int, int]:
    if len(value) != 2:
        raise ValueError("grid must be [rows, cols]")
    return int(value[0]), int(value[1])


def _palette(value: Sequence[Sequence[int]]) -> tuple[RGB, ...]:
    return tuple(_rgb_tuple(colour) for colour in value)


_CONVERT: dict[str, Any] = {
    **dict.fromkeys(
        ("image_size", "n_queries", "n_candidates", "n_pairs", "n_objects", "seed"), int
    ),
    "object_size": float,
    "shapes": lambda value: tuple(str(name) for name in value),
    "grid": _grid,
    "query_palette": _palette,
    "target_palette": _palette,
    "background": _rgb_tuple,
    "jitter": lambda value: value if isinstance(value, Jitter) else Jitter(**dict(value)),
}


@dataclass(frozen=True)
class BindingSettings:
    """Parameters of the binding dataset, built by :meth:`from_config` (every value from the
    ``datasets.binding`` section or its schema default, schemas/datasets.schema.yaml)."""

    image_size: int
    n_queries: int
    n_candidates: int
    n_pairs: int
    shapes: tuple[str, ...]
    grid: tuple[int, int]
    n_objects: int
    object_size: float
    query_palette: tuple[RGB, ...]
    target_palette: tuple[RGB, ...]
    background: RGB
    jitter: Jitter
    seed: int

    @classmethod
    def from_config(cls, binding: Mapping[str, Any]) -> BindingSettings:
        """Build from the ``datasets.binding`` config section; a key it leaves out takes the
        schema's default (:func:`repdiag.core.settings.schema_section`)."""
        known = {f.name for f in cls.__dataclass_fields__.values()}
        unknown = sorted(set(binding) - known)
        if unknown:
            raise ConfigError(
                f"unknown key {KEY}.{unknown[0]}; allowed keys: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for key, value in (schema_section(KEY) | dict(binding)).items():
            try:
                values[key] = _CONVERT[key](value)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{KEY}.{key} = {value!r} is invalid: {err}") from err
        return cls(**values)

    def to_config(self) -> dict[str, Any]:
        """The parameters as plain config values (the inverse of :meth:`from_config`)."""
        return _plain(asdict(self))

    @property
    def n_slots(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_arrangements(self) -> int:
        """Arrangements a query can be confused with: its shapes permuted over its occupied slots."""
        return n_arrangements([1] * self.n_objects, self.n_objects)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the ``datasets.binding`` key of any inconsistency."""
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown:
            raise ConfigError(
                f"{KEY}.shapes: unknown shape {unknown[0]!r}; choose from {', '.join(SHAPES.names())}"
            )
        if len(set(self.shapes)) != len(self.shapes):
            raise ConfigError(f"{KEY}.shapes lists a shape twice: {list(self.shapes)}")
        if min(self.grid) < 1:
            raise ConfigError(
                f"{KEY}.grid must have at least one row and column, got {list(self.grid)}"
            )
        if not 1 <= self.n_objects <= self.n_slots:
            raise ConfigError(
                f"{KEY}.n_objects = {self.n_objects} must be between 1 and the {self.n_slots} slots "
                f"of the {self.grid[0]}x{self.grid[1]} grid"
            )
        if self.n_objects > len(self.shapes):
            raise ConfigError(
                f"{KEY}.n_objects = {self.n_objects} exceeds the {len(self.shapes)} shapes in "
                f"{KEY}.shapes (a scene shows distinct shapes); add shapes or lower n_objects"
            )
        arrangements = self.n_arrangements
        if not 2 <= self.n_candidates <= arrangements:
            raise ConfigError(
                f"{KEY}.n_candidates = {self.n_candidates} must be between 2 and the {arrangements} "
                f"arrangements of {self.n_objects} distinct shapes over their {self.n_objects} "
                "occupied slots (candidates differ only in which shape sits in which occupied "
                "slot); lower n_candidates or raise n_objects"
            )
        for key in ("n_queries", "n_pairs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{KEY}.{key} must be positive, got {getattr(self, key)}")
        if self.n_pairs % 2:
            raise ConfigError(
                f"{KEY}.n_pairs = {self.n_pairs} must be even (half same, half different)"
            )
        self._validate_colours()
        self._validate_geometry()

    def _validate_colours(self) -> None:
        if any(not 0 <= c <= 255 for c in self.background):
            raise ConfigError(f"{KEY}.background: RGB values must lie in [0, 255]")
        for key in ("query_palette", "target_palette"):
            palette = getattr(self, key)
            if not palette:
                raise ConfigError(f"{KEY}.{key} is empty; give at least one RGB colour")
            if len(set(palette)) != len(palette):
                raise ConfigError(f"{KEY}.{key} lists a colour twice: {[list(c) for c in palette]}")
            if any(not 0 <= c <= 255 for colour in palette for c in colour):
                raise ConfigError(f"{KEY}.{key}: RGB values must lie in [0, 255]")
            if self.background in palette:
                raise ConfigError(
                    f"{KEY}.background {list(self.background)} is also in {KEY}.{key}: "
                    "objects of that colour would be invisible"
                )
        shared = sorted(set(self.query_palette) & set(self.target_palette))
        if shared:
            raise ConfigError(
                f"{KEY}.target_palette shares {[list(c) for c in shared]} with {KEY}.query_palette; "
                "the palettes must be disjoint so that colour can never be matched"
            )

    def _validate_geometry(self) -> None:
        cell = min(self.image_size / self.grid[0], self.image_size / self.grid[1])
        if cell < MIN_CELL_PX:
            raise ConfigError(
                f"{KEY}.image_size = {self.image_size} gives {cell:.1f} px cells on a "
                f"{self.grid[0]}x{self.grid[1]} grid; cells need >= {MIN_CELL_PX} px"
            )
        largest = self.object_size * (1.0 + self.jitter.scale)
        if largest > 1.0 + 1e-12:
            raise ConfigError(
                f"{KEY}.jitter.scale = {self.jitter.scale} with {KEY}.object_size = "
                f"{self.object_size} makes objects up to {largest:.3f} of the room in a cell (> 1): "
                "they could leave their slot; lower one of them"
            )


def check_binding_config(config: Mapping[str, Any]) -> None:
    """Semantic check of ``datasets.binding`` (registered in ``repdiag.binding.config_checks()``)."""
    datasets = config.get("datasets") or {}
    if "binding" in datasets:
        BindingSettings.from_config(datasets["binding"] or {}).validate()
    check_scene_names(config)


def check_scene_names(config: Mapping[str, Any]) -> None:
    """``zoo.scenes.shapes`` and ``colours`` name registered shapes and palette colours (else the
    zoo's jobs would fail after their set-up, without the key)."""
    import difflib

    from repdiag.encoders.zoo.scenes import PALETTE

    scenes = (config.get("zoo") or {}).get("scenes") or {}
    for key, known in (("shapes", SHAPES.names()), ("colours", list(PALETTE))):
        for name in scenes.get(key) or []:
            if name not in known:
                close = difflib.get_close_matches(str(name), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"zoo.scenes.{key}: {name!r} is not one of {', '.join(sorted(known))}{hint}"
                )


def _arrangement(rng: np.random.Generator, params: BindingSettings) -> np.ndarray:
    """A random arrangement: ``n_objects`` distinct shapes in distinct slots, -1 elsewhere."""
    arrangement = np.full(params.n_slots, -1, dtype=np.int8)
    slots = rng.choice(params.n_slots, params.n_objects, replace=False)
    arrangement[slots] = rng.choice(len(params.shapes), params.n_objects, replace=False)
    return arrangement


def _other_arrangements(
    rng: np.random.Generator, arrangement: np.ndarray, count: int
) -> list[np.ndarray]:
    """``count`` distinct arrangements other than ``arrangement`` with its occupied slots and its
    shapes, permuted among those slots (rejection sampling; ``count`` must not exceed the number
    of such permutations minus one)."""
    occupied = np.flatnonzero(arrangement >= 0)
    seen = {arrangement.tobytes()}
    others: list[np.ndarray] = []
    while len(others) < count:
        candidate = arrangement.copy()
        candidate[occupied] = rng.permutation(arrangement[occupied])
        if candidate.tobytes() not in seen:
            seen.add(candidate.tobytes())
            others.append(candidate)
    return others


def _colours(
    rng: np.random.Generator, arrangement: np.ndarray, palette: Sequence[RGB], background: RGB
) -> np.ndarray:
    """RGB per slot (uint8 (slots, 3)): distinct palette colours when the palette is large enough,
    drawn independently of everything else; ``background`` in empty slots."""
    colours = np.tile(np.asarray(background, dtype=np.uint8), (len(arrangement), 1))
    filled = np.flatnonzero(arrangement >= 0)
    picks = rng.choice(len(palette), len(filled), replace=len(palette) < len(filled))
    colours[filled] = np.asarray(palette, dtype=np.uint8)[picks]
    return colours


def _scenes(
    shapes: np.ndarray, colours: np.ndarray, jitter: Mapping[str, np.ndarray], names: Sequence[str]
) -> list[list[SceneObject]]:
    """Scene objects of images with arrangements ``shapes`` (N, slots), colours (N, slots, 3)."""
    scenes = []
    for image in range(shapes.shape[0]):
        scene = []
        for slot in np.flatnonzero(shapes[image] >= 0):
            scene.append(
                SceneObject(
                    shape=names[shapes[image, slot]],
                    slot=int(slot),
                    colour=_rgb_tuple(colours[image, slot]),
                    dx=float(jitter["dx"][image, slot]),
                    dy=float(jitter["dy"][image, slot]),
                    scale=float(jitter["scale"][image, slot]),
                    rotation=float(jitter["rotation"][image, slot]),
                )
            )
        scenes.append(scene)
    return scenes


def _render(
    params: BindingSettings, shapes: np.ndarray, colours: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Render images for arrangements of any leading shape (..., slots): uint8 (..., H, W, 3)."""
    lead = shapes.shape[:-1]
    flat_shapes = shapes.reshape(-1, params.n_slots)
    jitter = params.jitter.sample(rng, flat_shapes.shape)
    scenes = _scenes(flat_shapes, colours.reshape(-1, params.n_slots, 3), jitter, params.shapes)
    images = render_scenes(
        scenes, params.image_size, params.grid, params.background, object_size=params.object_size
    )
    return images.reshape(*lead, params.image_size, params.image_size, 3)


def matching_layout(params: BindingSettings, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Scene metadata of the matching task (no images): ``correct_index`` (query,),
    ``query_shape`` (query, slot), ``candidate_shape`` (query, candidate, slot) and the colours."""
    n_q, n_c, n_s = params.n_queries, params.n_candidates, params.n_slots
    query_shape = np.empty((n_q, n_s), dtype=np.int8)
    candidate_shape = np.empty((n_q, n_c, n_s), dtype=np.int8)
    query_colour = np.empty((n_q, n_s, 3), dtype=np.uint8)
    candidate_colour = np.empty((n_q, n_c, n_s, 3), dtype=np.uint8)
    correct = rng.integers(0, n_c, size=n_q)
    for q in range(n_q):
        query_shape[q] = _arrangement(rng, params)
        query_colour[q] = _colours(rng, query_shape[q], params.query_palette, params.background)
        distractors = iter(_other_arrangements(rng, query_shape[q], n_c - 1))
        for c in range(n_c):
            candidate_shape[q, c] = query_shape[q] if c == correct[q] else next(distractors)
            candidate_colour[q, c] = _colours(
                rng, candidate_shape[q, c], params.target_palette, params.background
            )
    return {
        "correct_index": correct.astype(np.int64),
        "query_shape": query_shape,
        "candidate_shape": candidate_shape,
        "query_colour": query_colour,
        "candidate_colour": candidate_colour,
    }


def pair_layout(params: BindingSettings, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Scene metadata of the Same/Different pairs (no images): ``pair_same`` (pair,) with exactly
    half ones, ``pair_shape`` (pair, member, slot), ``pair_colour``; member 0 uses the query
    palette, member 1 the target palette."""
    n_p, n_s = params.n_pairs, params.n_slots
    same = rng.permutation(np.arange(n_p) < n_p // 2).astype(np.int8)
    pair_shape = np.empty((n_p, 2, n_s), dtype=np.int8)
    pair_colour = np.empty((n_p, 2, n_s, 3), dtype=np.uint8)
    for p in range(n_p):
        pair_shape[p, 0] = _arrangement(rng, params)
        pair_shape[p, 1] = (
            pair_shape[p, 0] if same[p] else _other_arrangements(rng, pair_shape[p, 0], 1)[0]
        )
        for member, palette in enumerate((params.query_palette, params.target_palette)):
            pair_colour[p, member] = _colours(
                rng, pair_shape[p, member], palette, params.background
            )
    return {
        "pair_same": same,
        "pair_shape": pair_shape,
        "pair_colour": pair_colour,
    }


DIMS = {name: dims for name, (_, dims) in CONTRACT.items()}


def _labels(values: Iterable[str]) -> np.ndarray:
    """Object-dtype strings: zarr v3 stores them as variable-length UTF-8, which has a spec
    (fixed-width numpy unicode does not and warns)."""
    return np.array(list(values), dtype=object)


def render_binding_dataset(params: BindingSettings) -> xr.Dataset:
    """The binding store's Dataset (variables, dims and coordinates as in docs/contracts.md).

    The matching task and the pairs use independent streams spawned from ``params.seed``, so the
    queries do not change when only ``n_pairs`` does. Same seed, same bytes.
    """
    params.validate()
    task_seed, pair_seed = np.random.SeedSequence(params.seed).spawn(2)
    task_rng, pair_rng = np.random.default_rng(task_seed), np.random.default_rng(pair_seed)
    task, pairs = matching_layout(params, task_rng), pair_layout(params, pair_rng)
    arrays = {
        "query_image": _render(params, task["query_shape"], task["query_colour"], task_rng),
        "candidate_image": _render(
            params, task["candidate_shape"], task["candidate_colour"], task_rng
        ),
        "pair_image": _render(params, pairs["pair_shape"], pairs["pair_colour"], pair_rng),
        **task,
        **pairs,
    }
    rows, cols = params.grid
    coords = {
        "query": _labels(f"q{i:05d}" for i in range(params.n_queries)),
        "candidate": np.arange(params.n_candidates, dtype=np.int64),
        "pair": _labels(f"p{i:05d}" for i in range(params.n_pairs)),
        "member": np.array([0, 1], dtype=np.int64),
        "slot": _labels(f"r{r}c{c}" for r in range(rows) for c in range(cols)),
        "shape_name": _labels(params.shapes),
        "channel": _labels(CHANNELS),
    }
    ds = xr.Dataset({name: (DIMS[name], value) for name, value in arrays.items()}, coords=coords)
    ds.attrs = {
        "description": "attribute-binding benchmark: match the query's shape-to-slot arrangement "
        "among candidates drawn in a disjoint palette; Same/Different arrangement pairs",
        "image_size": params.image_size,
        "grid": list(params.grid),
        "n_candidates": params.n_candidates,
        "chance": 1.0 / params.n_candidates,
    }
    return ds


def chunk_encoding(
    ds: xr.Dataset, chunk_bytes: int = CHUNK_BYTES
) -> dict[str, dict[str, tuple[int, ...]]]:
    """Zarr chunks of at most ~``chunk_bytes`` along the first dimension of the image arrays."""
    encoding = {}
    for name in ("query_image", "candidate_image", "pair_image"):
        shape = ds[name].shape
        per_item = max(1, int(np.prod(shape[1:])) * ds[name].dtype.itemsize)
        encoding[name] = {"chunks": (max(1, min(shape[0], chunk_bytes // per_item)), *shape[1:])}
    return encoding
