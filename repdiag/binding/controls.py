"""Control encoders of the binding benchmark: what each one can see is known, so its score is too.

Each control is an ``nn.Module`` mapping images preprocessed to [0, 1] (``preprocess_cfg``: no
normalisation, the dataset's own size) of shape (N, 3, S, S) to features (N, D). They are built by
name from :data:`CONTROLS` (:func:`build_control`) or, in a config, as ``source: python`` entries::

    oracle: {source: python, id: "repdiag.binding.controls:shape_oracle", family: control}

Their keyword arguments default to the embedded default's dataset (64 px, a 2x2 grid, the four
benchmark shapes at ``object_size`` 0.85, rotation within +-15 degrees); give ``kwargs`` for
another one (``image_size: 224`` for ``config/paper.yaml``). A pre-run check
(``control_options.check_controls_config``) refuses a control whose image size, grid, shapes or
rotation range differ from ``datasets.binding``.

| control | sees | binding / Same-Different expected |
|---|---|---|
| ``shape_oracle`` | which shape sits in which slot (one-hot per slot) | 1.0 / 1.0 |
| ``layout_mask`` | the colour-blind foreground mask, downsampled | well above chance |
| ``occupancy`` | which slots hold an object | chance (constant on a full grid) |
| ``slot_area`` | foreground fraction of each slot | chance (equal-area shapes) |
| ``colour_histogram`` | colours of the foreground, anywhere | chance (independent palettes) |
| ``bag_of_shapes`` | which shapes are present, not where | chance (same multiset) |
| ``random_features`` | nothing: a random function of the pixels | chance |

The random-initialised copy of each zoo backbone is the seventh kind: a zoo run with
``steps: 0`` (``repdiag.encoders.zoo``), so it has the zoo's taps, head and normalisation.

Every pixel decision is a hard threshold, so the Jacobian of every control but
``random_features`` is zero almost everywhere (JER 0): the controls calibrate the binding and
Same/Different scores, not the JER, and the statistics keep them out of the correlations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from repdiag.binding.control_options import (
    DEFAULT_GRID,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_ROTATION_DEG,
)
from repdiag.common.render import BENCHMARK_SHAPES, SHAPE_AREA, SHAPES
from repdiag.core.registry import Registry

CONTROLS: Registry[Callable[..., nn.Module]] = Registry("control encoder")

FOREGROUND_THRESHOLD = 0.3  # max-channel distance from the background colour, in [0, 1] units
EMPTY_FRACTION = 0.02  # a slot whose foreground covers less of its cell is empty
CANONICAL_PX = 33  # side of the canonical frame of the template matcher
CANONICAL_EXTENT = 1.4  # the frame spans +-1.4 object radii


def background_distance(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W): each pixel's largest channel distance from the top-left (background) pixel."""
    return (x - x[:, :, :1, :1]).abs().amax(dim=1, keepdim=True)


class Control(nn.Module):
    """Base of the controls: preprocessing to [0, 1] at the dataset's size, the foreground mask."""

    preprocess_cfg: ClassVar[dict[str, Any]]

    def __init__(self, image_size: int = DEFAULT_IMAGE_SIZE) -> None:
        super().__init__()
        self.image_size = int(image_size)
        # An instance attribute (the registry reads it from the built module).
        self.preprocess_cfg = {  # type: ignore[misc]
            "input_size": self.image_size,
            "mean": [0.0, 0.0, 0.0],
            "std": [1.0, 1.0, 1.0],
            "interpolation": "nearest",
        }

    @staticmethod
    def foreground(x: torch.Tensor) -> torch.Tensor:
        """(N, 1, H, W) in {0, 1}: pixels whose colour differs from the top-left (background)
        pixel by more than FOREGROUND_THRESHOLD in some channel. Colour-blind."""
        return (background_distance(x) > FOREGROUND_THRESHOLD).to(x.dtype)


def _cells(mask: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """(N, C, H, W) -> (N, slots, C, h, w): the grid's cells in row-major slot order (cells of
    ``floor(H / rows)`` x ``floor(W / cols)`` px; a remainder at the far edge is dropped)."""
    rows, cols = int(grid[0]), int(grid[1])
    n, channels, height, width = mask.shape
    h, w = height // rows, width // cols
    cropped = mask[:, :, : rows * h, : cols * w]
    cells = cropped.reshape(n, channels, rows, h, cols, w).permute(0, 2, 4, 1, 3, 5)
    return cells.reshape(n, rows * cols, channels, h, w)


def _on_graph(features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``features`` unchanged in value but on ``x``'s autograd graph (a zero Jacobian, not none)."""
    return features + 0.0 * x.sum(dim=(1, 2, 3), keepdim=True).flatten(1)


@CONTROLS.register("layout_mask")
class LayoutMask(Control):
    """The foreground mask average-pooled to ``pool`` x ``pool``: the silhouettes and where they
    are, no colour. Binds wherever the silhouettes tell the shapes apart."""

    def __init__(self, image_size: int = DEFAULT_IMAGE_SIZE, pool: int = 16) -> None:
        super().__init__(image_size)
        self.pool = int(pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_graph(F.adaptive_avg_pool2d(self.foreground(x), self.pool).flatten(1), x)


@CONTROLS.register("slot_area")
class SlotArea(Control):
    """Foreground fraction of each grid cell: where objects are and how large, not which shape."""

    def __init__(
        self, image_size: int = DEFAULT_IMAGE_SIZE, grid: Sequence[int] = DEFAULT_GRID
    ) -> None:
        super().__init__(image_size)
        self.grid = tuple(int(g) for g in grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_graph(_cells(self.foreground(x), self.grid).mean(dim=(2, 3, 4)), x)


@CONTROLS.register("occupancy")
class Occupancy(SlotArea):
    """1 for each grid cell holding an object (foreground above EMPTY_FRACTION of the cell)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        area = _cells(self.foreground(x), self.grid).mean(dim=(2, 3, 4))
        return _on_graph((area > EMPTY_FRACTION).to(x.dtype), x)


@CONTROLS.register("colour_histogram")
class ColourHistogram(Control):
    """Joint RGB histogram (``bins`` per channel) of the foreground pixels, normalised to sum 1:
    the colours present anywhere in the image, neither shapes nor positions."""

    def __init__(self, image_size: int = DEFAULT_IMAGE_SIZE, bins: int = 4) -> None:
        super().__init__(image_size)
        self.bins = int(bins)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.foreground(x).flatten(1)  # (N, P)
        level = (x.clamp(0, 1) * self.bins).floor().clamp(max=self.bins - 1).flatten(2)  # (N, 3, P)
        index = ((level[:, 0] * self.bins + level[:, 1]) * self.bins + level[:, 2]).long()
        counts = torch.zeros(x.shape[0], self.bins**3, dtype=x.dtype, device=x.device)
        counts = counts.scatter_add(1, index, mask)
        return _on_graph(counts / counts.sum(dim=1, keepdim=True).clamp(min=1.0), x)


def _template(name: str, axis: torch.Tensor, degrees: float, supersample: int = 4) -> torch.Tensor:
    """Coverage (P, P) of shape ``name`` rotated by ``degrees`` counter-clockwise on the canonical
    pixels centred at ``axis`` (u right, v up; row 0 on top), ``supersample``^2 samples a pixel."""
    step = float(axis[1] - axis[0])
    offsets = (torch.arange(supersample, dtype=torch.float64) + 0.5) / supersample - 0.5
    fine = (axis.double()[:, None] + step * offsets[None, :]).flatten()
    v, u = torch.meshgrid(-fine, fine, indexing="ij")
    theta = math.radians(degrees)
    cos, sin = math.cos(theta), math.sin(theta)
    inside = SHAPES.get(name)((u * cos + v * sin).numpy(), (v * cos - u * sin).numpy())
    p = axis.numel()
    coverage = torch.from_numpy(inside.astype("float32")).reshape(p, supersample, p, supersample)
    return coverage.mean(dim=(1, 3))


class ShapeClassifier(Control):
    """Which shape sits in each slot, by template matching in a canonical frame.

    Per cell: the anti-aliased coverage of its object (colour distance from the background over
    the cell's largest), whose centroid c and area a give the object's radius R = sqrt(a /
    SHAPE_AREA) (every shape has area SHAPE_AREA R^2); the mask is resampled on a
    CANONICAL_PX^2 grid spanning c +- CANONICAL_EXTENT R, so position and scale jitter vanish,
    and compared by normalised correlation with each shape's inside-test at rotations spanning
    +-``rotation_deg``; the best shape wins. A cell below EMPTY_FRACTION foreground is empty.
    """

    def __init__(
        self,
        image_size: int = DEFAULT_IMAGE_SIZE,
        grid: Sequence[int] = DEFAULT_GRID,
        shapes: Sequence[str] = BENCHMARK_SHAPES,
        rotation_deg: float = DEFAULT_ROTATION_DEG,
        n_rotations: int = 7,
    ) -> None:
        super().__init__(image_size)
        self.grid = tuple(int(g) for g in grid)
        self.shapes = tuple(str(s) for s in shapes)
        axis = torch.linspace(-CANONICAL_EXTENT, CANONICAL_EXTENT, CANONICAL_PX)
        angles = torch.linspace(-rotation_deg, rotation_deg, n_rotations).tolist()
        templates = torch.stack(
            [torch.stack([_template(s, axis, a) for a in angles]) for s in self.shapes]
        )  # (shapes, rotations, P, P)
        templates = templates.flatten(2)
        self.register_buffer("templates", templates / templates.norm(dim=-1, keepdim=True))
        self.register_buffer("axis", axis)

    def slot_scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, slots, shapes) best template correlation per shape, (N, slots) occupied flags."""
        distance = background_distance(x)
        cells = _cells(distance, self.grid)  # (N, S, 1, h, w)
        n, slots, _, h, w = cells.shape
        # one object per cell in one colour: its distance over the cell's largest is its coverage
        flat = cells.reshape(n * slots, 1, h, w)
        flat = flat / flat.amax(dim=(2, 3), keepdim=True).clamp(min=1e-6)
        foreground = (cells > FOREGROUND_THRESHOLD).to(x.dtype)  # as Control.foreground
        occupied = foreground.mean(dim=(2, 3, 4)).flatten() > EMPTY_FRACTION
        mass = flat.sum(dim=(1, 2, 3))
        ys = torch.arange(h, dtype=x.dtype, device=x.device) + 0.5
        xs = torch.arange(w, dtype=x.dtype, device=x.device) + 0.5
        safe = mass.clamp(min=1.0)
        cy = (flat.sum(dim=(1, 3)) * ys).sum(dim=1) / safe
        cx = (flat.sum(dim=(1, 2)) * xs).sum(dim=1) / safe
        radius = torch.sqrt(safe / SHAPE_AREA)
        # grid_sample coordinates in [-1, 1] (align_corners=False: pixel centres at (i + .5)/n)
        gx = (cx[:, None] + radius[:, None] * self.axis[None, :]) / w * 2 - 1  # (M, P)
        gy = (cy[:, None] + radius[:, None] * self.axis[None, :]) / h * 2 - 1  # v up, y down
        grid = torch.stack(torch.broadcast_tensors(gx[:, None, :], gy[:, :, None]), dim=-1)
        canonical = F.grid_sample(flat, grid, align_corners=False).flatten(1)  # (M, P*P)
        canonical = canonical / canonical.norm(dim=1, keepdim=True).clamp(min=1e-12)
        correlation = torch.einsum("mp,srp->msr", canonical, self.templates).amax(dim=2)
        return correlation.reshape(n, slots, -1), occupied.reshape(n, slots)

    def slot_onehot(self, x: torch.Tensor) -> torch.Tensor:
        """(N, slots, shapes): one-hot of the best shape per occupied slot, zeros when empty."""
        scores, occupied = self.slot_scores(x)
        best = (scores == scores.amax(dim=2, keepdim=True)).to(x.dtype)
        return best * occupied[..., None].to(x.dtype)


@CONTROLS.register("shape_oracle")
class ShapeOracle(ShapeClassifier):
    """One-hot shape per slot, concatenated over slots: exactly the binding, nothing else."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_graph(self.slot_onehot(x).flatten(1), x)


@CONTROLS.register("bag_of_shapes")
class BagOfShapes(ShapeClassifier):
    """How many of each shape the image holds, summed over slots: what, never where."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _on_graph(self.slot_onehot(x).sum(dim=1), x)


@CONTROLS.register("random_features")
class RandomFeatures(Control):
    """h(x) = sqrt(2 / D) cos(omega W x + b) with W ~ N(0, 1/d), b ~ U[0, 2 pi): random Fourier
    features (Rahimi and Recht 2007) of a kernel so narrow (``omega`` = 100) that any two
    distinct scenes get effectively independent Gaussian-like vectors. Deterministic per image
    (not per call or batch), differentiable, and blind to everything the task asks."""

    def __init__(
        self,
        image_size: int = DEFAULT_IMAGE_SIZE,
        dim: int = 64,
        omega: float = 100.0,
        seed: int = 0,
    ) -> None:
        super().__init__(image_size)
        generator = torch.Generator().manual_seed(int(seed))
        d_in = 3 * self.image_size * self.image_size
        self.register_buffer(
            "weight", torch.randn(d_in, dim, generator=generator) / math.sqrt(d_in)
        )
        self.register_buffer("phase", 2 * math.pi * torch.rand(dim, generator=generator))
        self.omega, self.dim = float(omega), int(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float64: omega amplifies rounding, which would otherwise depend on the batch size
        projection = x.flatten(1).double() @ self.weight.double()
        features = torch.cos(self.omega * projection + self.phase.double())
        return (math.sqrt(2.0 / self.dim) * features).to(x.dtype)


def build_control(name: str, **kwargs: Any) -> nn.Module:
    """The control encoder registered as ``name``, built with ``kwargs``."""
    return CONTROLS.get(name)(**kwargs)


def shape_oracle(**kwargs: Any) -> nn.Module:
    return build_control("shape_oracle", **kwargs)


def layout_mask(**kwargs: Any) -> nn.Module:
    return build_control("layout_mask", **kwargs)


def occupancy(**kwargs: Any) -> nn.Module:
    return build_control("occupancy", **kwargs)


def slot_area(**kwargs: Any) -> nn.Module:
    return build_control("slot_area", **kwargs)


def colour_histogram(**kwargs: Any) -> nn.Module:
    return build_control("colour_histogram", **kwargs)


def bag_of_shapes(**kwargs: Any) -> nn.Module:
    return build_control("bag_of_shapes", **kwargs)


def random_features(**kwargs: Any) -> nn.Module:
    return build_control("random_features", **kwargs)
