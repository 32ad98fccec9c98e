"""A small vectorised rasteriser for scenes of simple shapes placed in the slots of a grid.

Geometry (pixel units, x right, y down, pixel ``(i, j)`` covers ``[j, j+1) x [i, i+1)``):

* the image (``H x W``) is cut into a ``rows x cols`` grid; slot ``s`` is cell
  ``(s // cols, s % cols)`` spanning ``x in [c W/cols, (c+1) W/cols)``, ``y in [r H/rows, (r+1) H/rows)``;
* every shape is an inside-test on the unit disc (``u`` right, ``v`` up, the shape lies inside
  ``u^2 + v^2 <= 1``); an object of radius ``R`` is that shape scaled by ``R``, rotated by
  ``rotation`` degrees counter-clockwise and centred at ``(cx, cy)``;
* ``R = object_size * scale * R_max`` with ``R_max = min(cell_w, cell_h) / 2 - 1/2``, and the centre is
  ``cell_centre + (dx, dy) * slack`` with ``slack = cell_half_size - 1/2 - R`` per axis. With
  ``|dx|, |dy| <= 1`` and ``object_size * scale <= 1`` every point of the object stays half a pixel
  inside its cell, so every pixel it touches has its centre in the cell: jitter can never move an
  object into another slot;
* anti-aliasing: the inside-test is evaluated on ``supersample^2`` regular sub-pixel samples and the
  pixel takes the covered fraction ``a``; the colour is ``round(old + a (colour - old))``.

Objects of one shape are rasterised together in batches of equal-size boxes (numpy broadcasting), so
thousands of scenes render in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from repdiag.core.registry import Registry

InsideFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
RGB = tuple[int, int, int]

SHAPES: Registry[InsideFn] = Registry("shape")
"""Shape name -> inside-test ``f(u, v) -> bool array`` on unit-disc coordinates (``v`` up).

Every shape has the same area, :data:`SHAPE_AREA` (in units of the radius squared), so at equal
scale no shape covers more pixels than another and foreground area says nothing about identity."""

BENCHMARK_SHAPES = ("circle", "square", "triangle", "cross")

SQRT3 = math.sqrt(3.0)
SHAPE_AREA = 1.2
"""Common area of every registered shape: a little below the largest equilateral triangle that
fits in the unit disc (3 sqrt(3) / 4 = 1.299), the smallest of the shapes' maxima."""


def _polygon(vertices: np.ndarray) -> InsideFn:
    """Even-odd (crossing number) inside-test of a closed polygon, vectorised over points."""
    vertices = np.asarray(vertices, dtype=np.float64)

    def inside(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        result = np.zeros(np.broadcast(u, v).shape, dtype=bool)
        edges = zip(vertices.tolist(), np.roll(vertices, -1, axis=0).tolist(), strict=True)
        for (u1, v1), (u2, v2) in edges:  # python floats keep float32 inputs float32
            if v1 == v2:
                continue
            straddles = (v1 > v) != (v2 > v)
            u_cross = u1 + (v - v1) * (u2 - u1) / (v2 - v1)
            result ^= straddles & (u < u_cross)
        return result

    return inside


def _regular_star(points: int, outer: float, inner: float) -> np.ndarray:
    angles = np.pi / 2 + np.arange(2 * points) * np.pi / points
    radii = np.where(np.arange(2 * points) % 2 == 0, outer, inner)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _circle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Unit disc: area pi."""
    return u * u + v * v <= 1.0


def _square(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Axis-aligned square inscribed in the unit circle: half-side 1/sqrt(2), area 2."""
    half = math.sqrt(0.5)
    return (np.abs(u) <= half) & (np.abs(v) <= half)


def _triangle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Equilateral triangle inscribed in the unit circle, apex up, centroid at 0: area 3 sqrt(3)/4."""
    return (v >= -0.5) & (SQRT3 * u + v <= 1.0) & (-SQRT3 * u + v <= 1.0)


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Plus sign: two bars of half-length 0.95 and half-width 0.3: area 2 (1.9 * 0.6) - 0.6^2."""
    au, av = np.abs(u), np.abs(v)
    return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))


def _diamond(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Square rotated by 45 degrees: ``|u| + |v| <= 1``, area 2."""
    return np.abs(u) + np.abs(v) <= 1.0


def _ring(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Annulus with radii 0.5 and 0.9: area pi (0.81 - 0.25)."""
    r2 = u * u + v * v
    return (r2 >= 0.25) & (r2 <= 0.81)


def _bar(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Horizontal bar: half-length 0.92, half-width 0.35, area 4 * 0.92 * 0.35."""
    return (np.abs(u) <= 0.92) & (np.abs(v) <= 0.35)


def _hexagon(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Regular hexagon with circumradius 1, vertices at (+-1, 0): area 3 sqrt(3)/2."""
    au, av = np.abs(u), np.abs(v)
    return (av <= SQRT3 / 2) & (SQRT3 * au + av <= SQRT3)


_STAR_OUTER, _STAR_INNER = 1.0, 0.45

# name -> (inside-test of the base shape, its closed-form area, its circumradius)
BASE_SHAPES: dict[str, tuple[InsideFn, float, float]] = {
    "circle": (_circle, math.pi, 1.0),
    "square": (_square, 2.0, 1.0),
    "triangle": (_triangle, 3 * SQRT3 / 4, 1.0),
    "cross": (_cross, 2 * 1.9 * 0.6 - 0.36, math.hypot(0.95, 0.3)),
    "diamond": (_diamond, 2.0, 1.0),
    "ring": (_ring, math.pi * (0.81 - 0.25), 0.9),
    # n-pointed star of outer radius R, inner r: area n R r sin(pi / n)
    "star": (
        _polygon(_regular_star(5, _STAR_OUTER, _STAR_INNER)),
        5 * _STAR_OUTER * _STAR_INNER * math.sin(math.pi / 5),
        _STAR_OUTER,
    ),
    "bar": (_bar, 4 * 0.92 * 0.35, math.hypot(0.92, 0.35)),
    "hexagon": (_hexagon, 3 * SQRT3 / 2, 1.0),
}


def _equal_area(base: InsideFn, area: float) -> InsideFn:
    """``base`` scaled about the origin by ``sqrt(SHAPE_AREA / area)``: its area becomes SHAPE_AREA."""
    inverse = float(math.sqrt(area / SHAPE_AREA))  # python float keeps float32 inputs float32

    def inside(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return base(u * inverse, v * inverse)

    inside.__doc__ = f"{base.__doc__} Scaled to area {SHAPE_AREA}."
    return inside


for _name, (_base, _area, _radius) in BASE_SHAPES.items():
    if _radius * math.sqrt(SHAPE_AREA / _area) > 1.0:
        raise AssertionError(f"shape {_name} at area {SHAPE_AREA} leaves the unit disc")
    SHAPES.add(_name, _equal_area(_base, _area))


@dataclass(frozen=True)
class SceneObject:
    """One object: a registered ``shape`` in grid cell ``slot`` (row-major index) with an RGB ``colour``.

    ``dx``, ``dy`` in [-1, 1] move the centre by that fraction of the free room in the cell (``dy``
    positive is down); ``scale`` multiplies the renderer's ``object_size``; ``rotation`` is in degrees,
    counter-clockwise.
    """

    shape: str
    slot: int
    colour: RGB
    dx: float = 0.0
    dy: float = 0.0
    scale: float = 1.0
    rotation: float = 0.0


@dataclass(frozen=True)
class Jitter:
    """Bounds of the per-object random jitter: ``dx, dy ~ U[-position, position]``,
    ``scale ~ U[1 - scale, 1 + scale]``, ``rotation ~ U[-rotation_deg, rotation_deg]``."""

    position: float = 0.5
    scale: float = 0.1
    rotation_deg: float = 15.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.position <= 1.0:
            raise ValueError(f"jitter.position must be in [0, 1], got {self.position}")
        if not 0.0 <= self.scale < 1.0:
            raise ValueError(f"jitter.scale must be in [0, 1), got {self.scale}")
        if not 0.0 <= self.rotation_deg <= 180.0:
            raise ValueError(f"jitter.rotation_deg must be in [0, 180], got {self.rotation_deg}")

    def sample(
        self, rng: np.random.Generator, shape: int | tuple[int, ...]
    ) -> dict[str, np.ndarray]:
        """Draw ``dx``, ``dy``, ``scale``, ``rotation`` arrays of ``shape`` (in that order from ``rng``)."""
        return {
            "dx": rng.uniform(-self.position, self.position, shape),
            "dy": rng.uniform(-self.position, self.position, shape),
            "scale": rng.uniform(1.0 - self.scale, 1.0 + self.scale, shape),
            "rotation": rng.uniform(-self.rotation_deg, self.rotation_deg, shape),
        }


def _size(image_size: int | tuple[int, int]) -> tuple[int, int]:
    height, width = (
        (image_size, image_size) if isinstance(image_size, int | np.integer) else image_size
    )
    return int(height), int(width)


def slot_cell(
    slot: int, image_size: int | tuple[int, int], grid: tuple[int, int]
) -> tuple[float, float, float, float]:
    """Continuous bounds ``(y0, y1, x0, x1)`` in pixels of grid cell ``slot`` (row-major)."""
    height, width = _size(image_size)
    rows, cols = grid
    if not 0 <= slot < rows * cols:
        raise ValueError(f"slot {slot} is outside the {rows}x{cols} grid (0..{rows * cols - 1})")
    row, col = divmod(int(slot), cols)
    return (
        row * height / rows,
        (row + 1) * height / rows,
        col * width / cols,
        (col + 1) * width / cols,
    )


def max_radius(image_size: int | tuple[int, int], grid: tuple[int, int]) -> float:
    """Largest object radius (pixels) that stays half a pixel inside a cell: ``min(cell)/2 - 1/2``."""
    height, width = _size(image_size)
    return min(height / grid[0], width / grid[1]) / 2.0 - 0.5


def object_geometry(
    objects: Sequence[SceneObject],
    image_size: int | tuple[int, int],
    grid: tuple[int, int],
    object_size: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres ``cx``, ``cy`` and radii ``R`` (pixels) of ``objects``; checks the jitter bounds."""
    height, width = _size(image_size)
    rows, cols = grid
    cell_h, cell_w = height / rows, width / cols
    r_max = max_radius(image_size, grid)
    if r_max <= 0:
        raise ValueError(
            f"cells of a {rows}x{cols} grid on {height}x{width} px are too small to draw in"
        )
    slot = np.array([o.slot for o in objects], dtype=np.int64)
    dx = np.array([o.dx for o in objects], dtype=np.float64)
    dy = np.array([o.dy for o in objects], dtype=np.float64)
    size = object_size * np.array([o.scale for o in objects], dtype=np.float64)
    if np.any((slot < 0) | (slot >= rows * cols)):
        raise ValueError(
            f"object slot outside the {rows}x{cols} grid: {sorted(set(slot.tolist()))}"
        )
    if np.any(np.abs(dx) > 1) or np.any(np.abs(dy) > 1):
        raise ValueError(
            "object offsets dx, dy must lie in [-1, 1] (fractions of the room in the cell)"
        )
    if np.any(size <= 0) or np.any(size > 1 + 1e-12):
        raise ValueError(
            "object_size * scale must lie in (0, 1]: larger objects would leave their cell"
        )
    radius = size * r_max
    row, col = np.divmod(slot, cols)
    cx = (col + 0.5) * cell_w + dx * np.maximum(cell_w / 2 - 0.5 - radius, 0.0)
    cy = (row + 0.5) * cell_h + dy * np.maximum(cell_h / 2 - 0.5 - radius, 0.0)
    return cx, cy, radius


def coverage(
    shape: str,
    cx: np.ndarray,
    cy: np.ndarray,
    radius: np.ndarray,
    rotation_deg: np.ndarray,
    x0: np.ndarray,
    y0: np.ndarray,
    box: tuple[int, int],
    supersample: int,
) -> np.ndarray:
    """Covered fraction (n, box_h, box_w) float32 of each object in its box with top-left ``(x0, y0)``."""
    inside = SHAPES.get(shape)
    box_h, box_w = box
    sub_x = (np.arange(box_w * supersample, dtype=np.float64) + 0.5) / supersample
    sub_y = (np.arange(box_h * supersample, dtype=np.float64) + 0.5) / supersample
    theta = np.deg2rad(rotation_deg)[:, None, None]
    # float32 for the large (n, H', W') arrays: offsets are < 1000 px, far within its precision
    cos = (np.cos(theta) / radius[:, None, None]).astype(np.float32)
    sin = (np.sin(theta) / radius[:, None, None]).astype(np.float32)
    px = ((x0[:, None] + sub_x[None, :]) - cx[:, None])[:, None, :].astype(np.float32)  # (n, 1, W')
    py = (cy[:, None] - (y0[:, None] + sub_y[None, :]))[:, :, None].astype(
        np.float32
    )  # (n, H', 1), up
    u = px * cos + py * sin  # the sample rotated by -theta = the shape rotated by +theta
    v = py * cos - px * sin
    mask = inside(u, v).view(np.uint8)
    n = len(cx)
    covered = mask.reshape(n, box_h, supersample, box_w, supersample).sum(
        axis=(2, 4), dtype=np.uint16
    )
    return covered.astype(np.float32) / np.float32(supersample * supersample)


def _composite(image: np.ndarray, alpha: np.ndarray, colour: np.ndarray, y0: int, x0: int) -> None:
    """``image[box] = round(old + a (colour - old))`` in place (a = 0 leaves pixels untouched)."""
    box_h, box_w = alpha.shape
    region = image[y0 : y0 + box_h, x0 : x0 + box_w].astype(np.float32)
    blended = region + alpha[:, :, None] * (colour[None, None, :] - region)
    image[y0 : y0 + box_h, x0 : x0 + box_w] = np.rint(blended).astype(np.uint8)


def render_scenes(
    scenes: Sequence[Sequence[SceneObject]],
    image_size: int | tuple[int, int],
    grid: tuple[int, int],
    background: RGB = (0, 0, 0),
    *,
    object_size: float = 0.7,
    supersample: int = 4,
    batch_points: int = 1 << 22,
) -> np.ndarray:
    """Render many scenes at once: uint8 array (N, H, W, 3).

    Objects of the same shape in all scenes are rasterised together (batches of at most
    ``batch_points`` sub-pixel samples), then composited into their images.
    """
    height, width = _size(image_size)
    if not 1 <= supersample <= 16:
        raise ValueError(f"supersample must be in [1, 16], got {supersample}")
    images = np.empty((len(scenes), height, width, 3), dtype=np.uint8)
    images[...] = np.asarray(background, dtype=np.uint8)
    objects = [obj for scene in scenes for obj in scene]
    if not objects:
        return images
    owner = np.repeat(np.arange(len(scenes)), [len(scene) for scene in scenes])
    for obj in objects:
        SHAPES.get(obj.shape)  # unknown shapes fail before any work
    cx, cy, radius = object_geometry(objects, (height, width), grid, object_size)
    colours = np.array([obj.colour for obj in objects], dtype=np.float32)
    rotation = np.array([obj.rotation for obj in objects], dtype=np.float64)
    box_h = min(math.ceil(2 * radius.max()) + 2, height)
    box_w = min(math.ceil(2 * radius.max()) + 2, width)
    x0 = np.clip(np.floor(cx - radius).astype(np.int64), 0, width - box_w)
    y0 = np.clip(np.floor(cy - radius).astype(np.int64), 0, height - box_h)
    batch = max(1, batch_points // (box_h * box_w * supersample * supersample))
    shape_names = np.array([obj.shape for obj in objects])
    for shape in sorted(set(shape_names.tolist())):
        members = np.flatnonzero(shape_names == shape)
        for start in range(0, len(members), batch):
            idx = members[start : start + batch]
            alpha = coverage(
                shape, cx[idx], cy[idx], radius[idx], rotation[idx], x0[idx], y0[idx],
                (box_h, box_w), supersample,
            )  # fmt: skip
            for k, i in enumerate(idx):
                _composite(images[owner[i]], alpha[k], colours[i], int(y0[i]), int(x0[i]))
    return images


def render_scene(
    objects: Sequence[SceneObject],
    image_size: int | tuple[int, int],
    grid: tuple[int, int],
    background: RGB = (0, 0, 0),
    *,
    object_size: float = 0.7,
    supersample: int = 4,
) -> np.ndarray:
    """Render one scene: uint8 (H, W, 3). See the module docstring for the geometry."""
    return render_scenes(
        [objects], image_size, grid, background, object_size=object_size, supersample=supersample
    )[0]
