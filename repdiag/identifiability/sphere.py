"""Latents on the unit sphere S^(d-1), positive-pair samplers and the five generative processes.

The identifiability study (``../shared/seeds/002``, after Zimmermann et al. 2021, "Contrastive
learning inverts the data generating process") draws latents z uniformly on S^2, positives z~
from a von Mises-Fisher (vMF) distribution around z (full support: the diversity condition holds)
or from a vMF on the sub-sphere that keeps the first ``n_fixed`` coordinates of z fixed
(restricted support: the diversity condition is violated), and negatives uniformly on S^2. An
injective generator g maps latents to observations x = g(z).

Sampling uses ``numpy.random.Generator`` (seeded by the caller) in float64; generators are frozen
``torch.nn.Module`` s whose parameters are drawn from their own seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from repdiag.core.errors import ConfigError
from repdiag.core.registry import Registry
from repdiag.core.settings import schema_section

# --------------------------------------------------------------------------------------------
# Sampling on the sphere
# --------------------------------------------------------------------------------------------


def _normalise(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def sample_uniform(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points uniform on S^(dim-1): normalised standard Gaussians (rotation invariance)."""
    return _normalise(rng.standard_normal((n, dim)))


def vmf_mean_cosine(kappa: float, dim: int) -> float:
    """E[mu^T x] for x ~ vMF(mu, kappa) on S^(dim-1): A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa).

    Computed with exponentially scaled Bessel functions (``scipy.special.ive``) so that large
    kappa does not overflow. For dim = 3 this equals coth(kappa) - 1/kappa.
    """
    from scipy.special import ive

    if kappa == 0:
        return 0.0
    return float(ive(dim / 2, kappa) / ive(dim / 2 - 1, kappa))


def _wood_cosines(kappa: float, dim: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """The cosine w = mu^T x of ``n`` vMF draws by Wood's (1994) rejection sampler.

    With b = (d-1) / (2 kappa + sqrt(4 kappa^2 + (d-1)^2)), x0 = (1-b)/(1+b) and
    c = kappa x0 + (d-1) log(1 - x0^2): draw Z ~ Beta((d-1)/2, (d-1)/2), U ~ U(0, 1), set
    W = (1 - (1+b) Z) / (1 - (1-b) Z) and accept when kappa W + (d-1) log(1 - x0 W) - c >= log U.
    The form of b avoids the cancellation of (-2 kappa + sqrt(4 kappa^2 + (d-1)^2)) / (d-1).
    """
    m1 = dim - 1.0
    b = m1 / (2.0 * kappa + math.sqrt(4.0 * kappa**2 + m1**2))
    x0 = (1.0 - b) / (1.0 + b)
    c = kappa * x0 + m1 * math.log(1.0 - x0**2)
    out = np.empty(n)
    todo = np.arange(n)
    while todo.size:
        beta = rng.beta(m1 / 2.0, m1 / 2.0, size=todo.size)
        w = (1.0 - (1.0 + b) * beta) / (1.0 - (1.0 - b) * beta)
        log_u = np.log(rng.uniform(size=todo.size))
        accept = kappa * w + m1 * np.log1p(-x0 * w) - c >= log_u
        out[todo[accept]] = w[accept]
        todo = todo[~accept]
    return out


def sample_vmf(mu: np.ndarray, kappa: float, rng: np.random.Generator) -> np.ndarray:
    """One exact draw x ~ vMF(mu_i, kappa) on S^(d-1) per row of ``mu`` (shape (n, d), d >= 2).

    x = w mu + sqrt(1 - w^2) v, with w from Wood's sampler and v uniform on the unit sphere of the
    tangent space orthogonal to mu (a Gaussian with its mu-component removed, normalised).
    kappa = 0 gives the uniform distribution.
    """
    mu = np.asarray(mu, dtype=np.float64)
    if mu.ndim != 2 or mu.shape[1] < 2:
        raise ValueError(f"sample_vmf needs mu of shape (n, d) with d >= 2, got {mu.shape}")
    if kappa < 0:
        raise ValueError(f"vMF concentration kappa must be >= 0, got {kappa}")
    mu = _normalise(mu)
    n, dim = mu.shape
    if kappa == 0:
        return sample_uniform(n, dim, rng)
    w = _wood_cosines(kappa, dim, n, rng)[:, None]
    tangent = rng.standard_normal((n, dim))
    tangent -= np.sum(tangent * mu, axis=1, keepdims=True) * mu
    tangent = _normalise(tangent)
    return w * mu + np.sqrt(np.clip(1.0 - w**2, 0.0, None)) * tangent


def _split_fixed(z: np.ndarray, n_fixed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed part u = z[:, :n_fixed], the direction of the free part v / |v| and its radius |v|."""
    z = np.asarray(z, dtype=np.float64)
    dim = z.shape[1]
    if not 1 <= n_fixed <= dim - 2:
        raise ValueError(
            f"n_fixed must be in [1, {dim - 2}] for latents on S^{dim - 1} (the free coordinates "
            f"need a sub-sphere of dimension >= 1), got {n_fixed}"
        )
    fixed, free = z[:, :n_fixed], z[:, n_fixed:]
    radius = np.linalg.norm(free, axis=1, keepdims=True)
    # |v| = 0 has probability zero; any direction is then valid
    direction = np.where(radius > 0, free / np.where(radius > 0, radius, 1.0), 0.0)
    direction[radius[:, 0] == 0, 0] = 1.0
    return fixed, direction, radius


def sample_restricted(
    z: np.ndarray, kappa: float, n_fixed: int, rng: np.random.Generator
) -> np.ndarray:
    """Positives with restricted support: u = z[:, :n_fixed] stays, v is perturbed on its sub-sphere.

    z = (u, v) with |u|^2 + |v|^2 = 1. The positive is z~ = (u, |v| s) with
    s ~ vMF(v / |v|, kappa) on S^(d - n_fixed - 1), so z~ stays on S^(d-1) and on the
    sub-manifold {z' : z'_u = u}: the conditional has no density w.r.t. the uniform measure
    and the diversity condition fails.
    """
    fixed, direction, radius = _split_fixed(z, n_fixed)
    return np.concatenate([fixed, radius * sample_vmf(direction, kappa, rng)], axis=1)


def sample_submanifold_uniform(
    z: np.ndarray, n_fixed: int, count: int, rng: np.random.Generator
) -> np.ndarray:
    """``count`` negatives per anchor, uniform on the anchor's sub-manifold {z' : z'_u = z_u}.

    Shape (n, count, d): the fixed coordinates are copied and the free part is |v| s with s
    uniform on S^(d - n_fixed - 1). These are the constrained negatives of support-corrected
    InfoNCE.
    """
    fixed, direction, radius = _split_fixed(z, n_fixed)
    n, n_free = direction.shape
    free = sample_uniform(n * count, n_free, rng).reshape(n, count, n_free) * radius[:, None, :]
    fixed = np.broadcast_to(fixed[:, None, :], (n, count, fixed.shape[1]))
    return np.concatenate([fixed, free], axis=2)


def sample_positives(
    z: np.ndarray, sampling: str, kappa: float, n_fixed: int, rng: np.random.Generator
) -> np.ndarray:
    """``sampling`` = "full" (vMF on S^(d-1)) or "restricted" (:func:`sample_restricted`)."""
    if sampling == "full":
        return sample_vmf(z, kappa, rng)
    if sampling == "restricted":
        return sample_restricted(z, kappa, n_fixed, rng)
    raise ConfigError(f"identifiability sampling must be 'full' or 'restricted', got {sampling!r}")


# --------------------------------------------------------------------------------------------
# Generators g: S^(d-1) -> R^D (frozen, seeded)
# --------------------------------------------------------------------------------------------

GENERATORS: Registry[Callable[..., Generator]] = Registry("generator")


class Generator(nn.Module):
    """A frozen injective map x = g(z); ``out_dim`` is the dimension of x."""

    name: str = ""

    def __init__(self, latent_dim: int, out_dim: int) -> None:
        super().__init__()
        self.latent_dim, self.out_dim = latent_dim, out_dim

    def spec(self) -> dict[str, Any]:
        """Plain description for provenance (name, dims)."""
        return {"name": self.name, "latent_dim": self.latent_dim, "out_dim": self.out_dim}


def rotate_plane(v: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotate the (v_1, v_2) plane of each row of ``v`` by ``angle`` (shape (n,)); other coordinates stay."""
    cos, sin = torch.cos(angle), torch.sin(angle)
    first = cos * v[:, 0] - sin * v[:, 1]
    second = sin * v[:, 0] + cos * v[:, 1]
    return torch.cat([first[:, None], second[:, None], v[:, 2:]], dim=1)


def _param_rng(seed: int) -> np.random.Generator:
    """Stream for a generator's parameters, independent of the training-data stream of the same seed."""
    return np.random.default_rng([seed, 17])


def haar_rotation(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-distributed rotation in SO(dim): QR of a Gaussian with the sign fix, det forced to +1."""
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


@GENERATORS.register("identity")
class IdentityGenerator(Generator):
    """x = z. ``seed`` is accepted for a uniform interface and unused."""

    name = "identity"

    def __init__(self, latent_dim: int, seed: int) -> None:
        super().__init__(latent_dim, latent_dim)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z


@GENERATORS.register("linear")
class LinearGenerator(Generator):
    """x = A z with A in R^(out_dim x d), entries N(0, 1/out_dim), full column rank.

    Injective because A has rank d; matrices with condition number above ``max_condition`` are
    redrawn, so that the map is also well conditioned.
    """

    name = "linear"

    def __init__(self, latent_dim: int, seed: int, out_dim: int, max_condition: float) -> None:
        if out_dim < latent_dim:
            raise ConfigError(
                f"identifiability.generators.linear.out_dim ({out_dim}) must be >= latent_dim "
                f"({latent_dim}) for an injective linear map"
            )
        super().__init__(latent_dim, out_dim)
        rng = _param_rng(seed)
        for _ in range(10_000):
            matrix = rng.standard_normal((out_dim, latent_dim)) / math.sqrt(out_dim)
            if np.linalg.cond(matrix) <= max_condition:
                break
        else:
            raise ConfigError(
                "identifiability.generators.linear.max_condition: no matrix under "
                f"{max_condition} in 10000 draws; raise it"
            )
        self.register_buffer("matrix", torch.tensor(matrix, dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.matrix.T


@GENERATORS.register("spiral")
class SpiralGenerator(Generator):
    """x = R_{alpha z_d}(z): the (z_1, z_2) plane rotated by an angle proportional to z_d.

    Each slice z_d = c is rotated rigidly and z_d is kept, so g is a bijection of R^d (and of
    S^(d-1)) with inverse R_{-alpha x_d}. ``alpha`` = ``angle_scale`` (radians per unit of z_d);
    ``seed`` is unused (the map is deterministic).
    """

    name = "spiral"

    def __init__(self, latent_dim: int, seed: int, angle_scale: float) -> None:
        if latent_dim < 3:
            raise ConfigError("identifiability.latent_dim must be >= 3 for the spiral generator")
        super().__init__(latent_dim, latent_dim)
        self.register_buffer("angle_scale", torch.tensor(float(angle_scale)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return rotate_plane(z, self.angle_scale * z[:, -1])


def slice_edges(n_slices: int) -> torch.Tensor:
    """Inner edges of ``n_slices`` equal slices of [-1, 1] (n_slices - 1 values)."""
    return torch.linspace(-1.0, 1.0, n_slices + 1)[1:-1]


@GENERATORS.register("patches")
class PatchesGenerator(Generator):
    """x = R P(z): piecewise rotations over slices of z_d, then a fixed rotation R.

    [-1, 1] is cut into ``n_slices`` equal slices of z_d; on slice k the (z_1, z_2) plane is
    rotated by theta_k ~ U(-max_angle, max_angle). P keeps z_d, so slices never mix and P is a
    (discontinuous) bijection; R is Haar-random in SO(d). Both are drawn from ``seed``.
    """

    name = "patches"

    def __init__(self, latent_dim: int, seed: int, n_slices: int, max_angle: float) -> None:
        if latent_dim < 3:
            raise ConfigError("identifiability.latent_dim must be >= 3 for the patches generator")
        super().__init__(latent_dim, latent_dim)
        rng = _param_rng(seed)
        angles = rng.uniform(-max_angle, max_angle, size=n_slices)
        self.register_buffer("angles", torch.tensor(angles, dtype=torch.float32))
        self.register_buffer("edges", slice_edges(n_slices))
        rotation = haar_rotation(latent_dim, rng)
        self.register_buffer("rotation", torch.tensor(rotation, dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        slice_index = torch.bucketize(z[:, -1].contiguous(), self.edges)
        return rotate_plane(z, self.angles[slice_index]) @ self.rotation.T


def condition_threshold(
    dim: int, quantile: float, n_samples: int, rng: np.random.Generator
) -> float:
    """The ``quantile`` of cond(W) over W with U(-1, 1) entries and unit-norm columns (Zimmermann 2021)."""
    samples = rng.uniform(-1.0, 1.0, size=(n_samples, dim, dim))
    samples /= np.linalg.norm(samples, axis=1, keepdims=True)
    conds = np.sort(np.linalg.cond(samples))
    return float(conds[min(int(n_samples * quantile), n_samples - 1)])


@GENERATORS.register("invertible_mlp")
class InvertibleMLPGenerator(Generator):
    """x = W_L s(... s(W_1 z)): square bias-free layers with leaky ReLU s(t) = max(t, slope t).

    Construction of Zimmermann et al. (2021, after Hyvarinen's PCL code): each W_l has
    U(-1, 1) entries with unit-norm columns and is redrawn until its condition number is below
    the ``cond_quantile`` quantile of that distribution (estimated from ``n_cond_samples``
    draws). Square invertible layers and an invertible activation make g a bijection of R^d.
    """

    name = "invertible_mlp"

    def __init__(
        self,
        latent_dim: int,
        seed: int,
        n_layers: int,
        slope: float,
        cond_quantile: float,
        n_cond_samples: int,
    ) -> None:
        super().__init__(latent_dim, latent_dim)
        rng = _param_rng(seed)
        threshold = condition_threshold(latent_dim, cond_quantile, n_cond_samples, rng)
        weights = []
        for _ in range(n_layers):
            while True:
                w = rng.uniform(-1.0, 1.0, size=(latent_dim, latent_dim))
                w /= np.linalg.norm(w, axis=0, keepdims=True)
                if np.linalg.cond(w) <= threshold:
                    break
            weights.append(w)
        self.slope = float(slope)
        self.register_buffer("weights", torch.tensor(np.stack(weights), dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = z
        for layer, w in enumerate(self.weights):
            x = x @ w.T
            if layer < len(self.weights) - 1:
                x = nn.functional.leaky_relu(x, self.slope)
        return x


def build_generator(name: str, latent_dim: int, seed: int, **params: Any) -> Generator:
    """The registered generator ``name`` with its config ``params`` (a parameter they leave out
    takes the schema's ``identifiability.generators.<name>`` default), frozen, parameters from
    ``seed``."""
    params = schema_section(f"identifiability.generators.{name}") | dict(params)
    generator = GENERATORS.get(name)(latent_dim=latent_dim, seed=seed, **params)
    generator.requires_grad_(False)
    return generator.eval()
