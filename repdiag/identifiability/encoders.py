"""Encoders f for the identifiability study: a low-bias MLP and one inverse model per generator.

The recovered map is h = f(g(z)). The MLPs (low inductive bias) can represent almost any map; an
inverse-model encoder (high inductive bias) has the functional form of g^-1 with learnable
parameters, so that with the true parameters (:meth:`InverseEncoder.exact`) f(g(z)) = z exactly.
Every encoder projects its output onto the unit sphere when ``normalize`` is set, since the
latents live on S^(d-1).

Two MLP variants (:data:`MLP_VARIANTS`): ``paper``, the encoder of Zimmermann et al. (2021) and
of the public code of the paper's authors (the default), and ``small``, the project's earlier
three-layer leaky-ReLU MLP. An encoder whose ``separate_views`` is true is called once per view
(anchors, positives, negatives) by the training loop, so that its BatchNorm statistics are
those of one view.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from repdiag.core.registry import Registry
from repdiag.identifiability.sphere import (
    Generator,
    InvertibleMLPGenerator,
    LinearGenerator,
    PatchesGenerator,
    SpiralGenerator,
    rotate_plane,
    slice_edges,
)


def _project(h: torch.Tensor, normalize: bool) -> torch.Tensor:
    return nn.functional.normalize(h, dim=-1) if normalize else h


class MLPEncoder(nn.Module):
    """f(x) = normalise(BN(W_L s(... s(W_1 x + b_1)) + b_L)), s = leaky ReLU: the ``small`` variant.

    The project's first low-bias encoder (hidden 128-128-128, about 3.5e4 parameters); all views
    go through it in one pass (``separate_views`` false), as before.

    BN is a batch normalisation without affine parameters (batch statistics in training, running
    ones in evaluation) before the projection onto the sphere. Without it a freshly initialised
    leaky-ReLU MLP maps the whole sphere into a small cap (the mean output has norm ~0.9): the
    map S^2 -> S^2 then has degree 0 and, since normalisation makes the origin a barrier, InfoNCE
    converges to a folded, non-injective solution (R^2 ~ 2/3 on every seed we tried). Centring
    the pre-projection output starts it around the origin, so a bijective solution is reachable.
    """

    separate_views = False

    def __init__(
        self,
        in_dim: int,
        out_dim: int = 3,
        hidden: Sequence[int] = (128, 128, 128),
        normalize: bool = True,
    ) -> None:
        super().__init__()
        widths = [in_dim, *hidden, out_dim]
        layers: list[nn.Module] = []
        for depth, (a, b) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(a, b))
            if depth < len(widths) - 2:
                layers.append(nn.LeakyReLU())
        self.net = nn.Sequential(*layers)
        self.centre = nn.BatchNorm1d(out_dim, affine=False)
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _project(self.centre(self.net(x)), self.normalize)


PAPER_HIDDEN = (128, 256, 256, 256, 128)


class PaperMLPEncoder(nn.Module):
    """f(x) = normalise(W_6 b_5(... b_1(x)) + c_6), b_l(x) = BN_l(ReLU(W_l x + c_l)).

    The low-inductive-bias encoder of Zimmermann et al. (2021, "Contrastive learning inverts the
    data generating process", their synthetic MLP) as used by the paper's authors: hidden widths
    128-256-256-256-128, each Linear -> ReLU -> BatchNorm1d with affine parameters, then
    Linear -> out_dim and L2 normalisation (about 2.0e5 parameters for d = 3). ``separate_views``:
    anchors, positives and negatives pass through it separately, so each BatchNorm normalises
    with the statistics of one view (training mode; running statistics in evaluation).
    """

    separate_views = True

    def __init__(
        self,
        in_dim: int,
        out_dim: int = 3,
        hidden: Sequence[int] = PAPER_HIDDEN,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise([in_dim, *hidden]):
            layers += [nn.Linear(a, b), nn.ReLU(), nn.BatchNorm1d(b, affine=True)]
        layers.append(nn.Linear(hidden[-1] if hidden else in_dim, out_dim))
        self.net = nn.Sequential(*layers)
        self.normalize = normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _project(self.net(x), self.normalize)


def paper_mlp_parameter_count(in_dim: int, out_dim: int, hidden: Sequence[int]) -> int:
    """sum_l (w_(l-1) + 1) w_l + 2 w_l over hidden layers (Linear weight, bias; BN scale, shift)
    plus (w_L + 1) out_dim for the output layer, with w_0 = in_dim."""
    widths = [in_dim, *hidden]
    hidden_count = sum((a + 1) * b + 2 * b for a, b in itertools.pairwise(widths))
    return hidden_count + (widths[-1] + 1) * out_dim


MLP_VARIANTS = {"paper": PaperMLPEncoder, "small": MLPEncoder}


class InverseEncoder(nn.Module):
    """Base of the inverse-model encoders: ``random`` for training, ``exact`` for the true g^-1."""

    normalize: bool = True

    @classmethod
    def random(
        cls, generator: Generator, *, normalize: bool = True, **options: float
    ) -> InverseEncoder:
        raise NotImplementedError

    @classmethod
    def exact(cls, generator: Generator, **options: float) -> InverseEncoder:
        raise NotImplementedError


INVERSE_ENCODERS: Registry[type[InverseEncoder]] = Registry("inverse-model encoder")


def _random_matrix(rows: int, cols: int) -> torch.Tensor:
    """Kaiming-uniform init as nn.Linear uses, drawn from torch's global (seeded) generator."""
    return nn.Linear(cols, rows, bias=False).weight.detach().clone()


class LinearInverse(InverseEncoder):
    """f(x) = W x, W in R^(d x D): the inverse family of the Identity (W = I) and Linear (W = A^+) maps."""

    def __init__(self, weight: torch.Tensor, normalize: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone().float())
        self.normalize = normalize

    @classmethod
    def random(
        cls, generator: Generator, *, normalize: bool = True, **options: float
    ) -> LinearInverse:
        return cls(_random_matrix(generator.latent_dim, generator.out_dim), normalize)

    @classmethod
    def exact(cls, generator: Generator, **options: float) -> LinearInverse:
        if isinstance(generator, LinearGenerator):
            weight = torch.linalg.pinv(generator.matrix.double()).float()
        else:
            weight = torch.eye(generator.latent_dim)
        return cls(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _project(x @ self.weight.T, self.normalize)


INVERSE_ENCODERS.add("identity", LinearInverse)
INVERSE_ENCODERS.add("linear", LinearInverse)


@INVERSE_ENCODERS.register("spiral")
class SpiralInverse(InverseEncoder):
    """f(x) = L R_{-a x_d}(x): the inverse rotation with a learned angle scale a, then a learned L.

    With a = alpha (the generator's angle scale) and L = I, f = g^-1 exactly. a starts uniform in
    [-pi, pi]; L starts at a random matrix, like the linear inverse.
    """

    def __init__(self, angle_scale: float, output: torch.Tensor, normalize: bool = True) -> None:
        super().__init__()
        self.angle_scale = nn.Parameter(torch.tensor(float(angle_scale)))
        self.output = nn.Parameter(output.clone().float())
        self.normalize = normalize

    @classmethod
    def random(
        cls, generator: Generator, *, normalize: bool = True, **options: float
    ) -> SpiralInverse:
        angle = (torch.rand(()) * 2 - 1) * math.pi
        return cls(
            float(angle), _random_matrix(generator.latent_dim, generator.latent_dim), normalize
        )

    @classmethod
    def exact(cls, generator: Generator, **options: float) -> SpiralInverse:
        assert isinstance(generator, SpiralGenerator)
        return cls(float(generator.angle_scale), torch.eye(generator.latent_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        unrotated = rotate_plane(x, -self.angle_scale * x[:, -1])
        return _project(unrotated @ self.output.T, self.normalize)


@INVERSE_ENCODERS.register("patches")
class PatchesInverse(InverseEncoder):
    """f(x) = R_{-phi(y_d)}(y), y = M x, phi(t) = sum_k w_k(t) phi_k: a soft inverse piecewise rotation.

    The slice weights are differences of sigmoids at the generator's slice edges e_k,
    w_k(t) = sigma(s (t - e_k)) - sigma(s (t - e_{k+1})) with e_0 = -inf, e_K = +inf, so they sum
    to one and tend to the hard slice indicator as the sharpness s grows; ``sharpness = inf``
    uses the hard indicator. M (true value R^T) and the angles phi_k (true theta_k) are learned.
    During training s grows geometrically from ``sharpness_start`` to ``sharpness``
    (:meth:`set_progress`, called by the training loop): a smooth map first, so that M can find
    the slicing axis, then an ever closer approximation of the hard inverse.
    """

    def __init__(
        self,
        mixing: torch.Tensor,
        angles: torch.Tensor,
        sharpness: float = 100.0,
        normalize: bool = True,
        sharpness_start: float | None = None,
    ) -> None:
        super().__init__()
        self.mixing = nn.Parameter(mixing.clone().float())
        self.angles = nn.Parameter(angles.clone().float())
        self.register_buffer("edges", slice_edges(len(angles)))
        self.final_sharpness = float(sharpness)
        self.sharpness_start = float(sharpness if sharpness_start is None else sharpness_start)
        self.sharpness = self.final_sharpness
        self.normalize = normalize

    def set_progress(self, fraction: float) -> None:
        """Sharpness at ``fraction`` of training: s0 (s1/s0)^fraction; s1 from ``fraction`` = 1 on."""
        fraction = min(max(fraction, 0.0), 1.0)
        if math.isinf(self.final_sharpness) or self.sharpness_start == self.final_sharpness:
            self.sharpness = self.final_sharpness
            return
        self.sharpness = (
            self.sharpness_start * (self.final_sharpness / self.sharpness_start) ** fraction
        )

    @classmethod
    def random(
        cls,
        generator: Generator,
        *,
        normalize: bool = True,
        sharpness: float = 100.0,
        sharpness_start: float = 2.0,
        **options: float,
    ) -> PatchesInverse:
        assert isinstance(generator, PatchesGenerator)
        n_slices, dim = len(generator.angles), generator.latent_dim
        angles = (torch.rand(n_slices) * 2 - 1) * math.pi
        encoder = cls(_random_matrix(dim, dim), angles, sharpness, normalize, sharpness_start)
        encoder.set_progress(0.0)
        return encoder

    @classmethod
    def exact(
        cls, generator: Generator, *, sharpness: float = math.inf, **options: float
    ) -> PatchesInverse:
        assert isinstance(generator, PatchesGenerator)
        return cls(generator.rotation.T, generator.angles, sharpness)

    def slice_weights(self, t: torch.Tensor) -> torch.Tensor:
        """(n, K) soft (or, with infinite sharpness, hard) membership of t in each slice."""
        if math.isinf(self.sharpness):
            index = torch.bucketize(t.contiguous(), self.edges)
            return nn.functional.one_hot(index, len(self.angles)).to(t.dtype)
        above = torch.sigmoid(self.sharpness * (t[:, None] - self.edges[None, :]))
        ones, zeros = torch.ones_like(t[:, None]), torch.zeros_like(t[:, None])
        return torch.cat([ones, above], dim=1) - torch.cat([above, zeros], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.mixing.T
        angle = self.slice_weights(y[:, -1]) @ self.angles
        return _project(rotate_plane(y, -angle), self.normalize)


@INVERSE_ENCODERS.register("invertible_mlp")
class InvertibleMLPInverse(InverseEncoder):
    """f(x) = V_1 s^-1(... s^-1(V_L x)): the inverse's shape, s^-1(t) = min(t, t / slope).

    With V_l = W_l^-1 (the generator's layers, in reverse order) f = g^-1 exactly.
    """

    def __init__(self, weights: torch.Tensor, slope: float, normalize: bool = True) -> None:
        super().__init__()
        self.weights = nn.Parameter(weights.clone().float())
        self.slope = float(slope)
        self.normalize = normalize

    @classmethod
    def random(
        cls, generator: Generator, *, normalize: bool = True, **options: float
    ) -> InvertibleMLPInverse:
        assert isinstance(generator, InvertibleMLPGenerator)
        dim, layers = generator.latent_dim, len(generator.weights)
        weights = torch.stack([_random_matrix(dim, dim) for _ in range(layers)])
        return cls(weights, generator.slope, normalize)

    @classmethod
    def exact(cls, generator: Generator, **options: float) -> InvertibleMLPInverse:
        assert isinstance(generator, InvertibleMLPGenerator)
        inverses = torch.linalg.inv(generator.weights.double()).flip(0).float()
        return cls(inverses, generator.slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer, v in enumerate(self.weights):
            h = h @ v.T
            if layer < len(self.weights) - 1:
                h = nn.functional.leaky_relu(h, 1.0 / self.slope)
        return _project(h, self.normalize)


@dataclass(frozen=True)
class LatentEncoderSettings:
    """A cell's encoder: what :func:`build_latent_encoder` builds (from ``cell_params(...)
    ["encoder"]``, whose values come from ``identifiability.encoders``, every default in the
    schema). ``kind`` "mlp" reads ``variant`` and ``hidden`` (None: the variant's widths), the
    inverse of the patches generator the two sharpnesses; a setting no kind here reads is None."""

    kind: str
    normalize: bool
    variant: str | None = None
    hidden: tuple[int, ...] | None = None
    patches_sharpness: float | None = None
    patches_sharpness_start: float | None = None

    @classmethod
    def of(cls, encoder: Mapping[str, Any]) -> LatentEncoderSettings:
        """The spec of a cell's ``encoder`` params (the training keys, lr and lr_schedule, are
        the training's)."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in encoder.items() if key in names}
        if values.get("hidden") is not None:
            values["hidden"] = tuple(values["hidden"])
        return cls(**values)


def build_latent_encoder(
    spec: LatentEncoderSettings, generator: Generator, *, seed: int
) -> nn.Module:
    """``spec.kind`` = "mlp" (the MLP ``variant`` of :data:`MLP_VARIANTS`) or "inverse" (the
    registered inverse model of ``generator``).

    Initial weights come from ``torch.manual_seed(seed)`` so a cell is reproducible.
    """
    from repdiag.core.errors import ConfigError

    torch.manual_seed(seed)
    if spec.kind == "mlp":
        if spec.variant not in MLP_VARIANTS:
            raise ConfigError(
                f"identifiability.encoders.mlp.variant must be one of {sorted(MLP_VARIANTS)}, "
                f"got {spec.variant!r}"
            )
        hidden = spec.hidden
        if hidden is None:
            hidden = PAPER_HIDDEN if spec.variant == "paper" else (128, 128, 128)
        cls = MLP_VARIANTS[spec.variant]
        return cls(generator.out_dim, generator.latent_dim, hidden, spec.normalize)
    if spec.kind == "inverse":
        inverse = INVERSE_ENCODERS.get(generator.name)
        options = {}
        if inverse is PatchesInverse:
            sharpness = (spec.patches_sharpness, spec.patches_sharpness_start)
            if None in sharpness:
                raise ConfigError(
                    "the patches inverse needs identifiability.encoders.inverse.patches_sharpness "
                    f"and patches_sharpness_start, got {sharpness}"
                )
            options = {"sharpness": sharpness[0], "sharpness_start": sharpness[1]}
        return inverse.random(generator, normalize=spec.normalize, **options)
    raise ConfigError(f"identifiability encoder kind must be 'mlp' or 'inverse', got {spec.kind!r}")
