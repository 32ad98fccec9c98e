"""Paired data for the alignment study: the synthetic concept space and the paired-data type.

Real-embedding pairs (two encoders' embeddings of the same images) are built by
:mod:`repdiag.alignment.real_pairs` into the same :class:`PairedData`.

Synthetic data follow the generative picture of concept alignment (Sec. "problem" of the CoSAE
paper, ``../shared/seeds/004``): a sparse concept vector ``z`` in R^n (k active concepts with
magnitudes ~ U(0.5, 1.5)) is mapped into two domains by different maps,

    x_i = g_i(W_i z) + noise,    W_i in R^{d_i x n} with unit-norm Gaussian columns,

where ``g_i`` is the identity (``linear``) or the mild, invertible ``h -> h + a tanh(h)``
(``nonlinear``). Noise is Gaussian with standard deviation ``noise`` times the per-coordinate
RMS of the clean signal. Its draws depend only on the seed: the training and test noise come
from their own generators, and the RMS is that of ``g_i(W_i z)`` on the first domain's training
concepts, so the test split is bit-identical across paired fractions.

Presets (``alignment.preset``; :data:`repdiag.alignment.grid.PRESETS`): ``easy`` is the original testbed,
``n_concepts`` exchangeable concepts (uniform frequency, the same magnitude law, no
correlation, all shared). ``hard`` adds what makes methods differ:

- power-law frequencies: the ``k`` active concepts of a row are drawn without replacement with
  probabilities ``p_c ∝ (r_c + 1)^(-frequency_exponent)`` (``r_c`` a random rank), by the
  Gumbel-top-k trick: the ``k`` largest keys ``log p_c + G_c``, ``G_c`` standard Gumbel;
- correlated concepts: consecutive pairs ``(2m, 2m+1)`` share a Gaussian copula of correlation
  ``correlation`` in their Gumbel keys, ``G_c = -log(-log Phi(sqrt(rho) s_m + sqrt(1 - rho) e_c))``,
  so the two tend to be active together;
- domain-specific concepts: ``n_specific`` extra concepts per domain, indices
  ``n_concepts .. n_concepts + n_specific - 1`` seen by domain a only and the next ``n_specific``
  by domain b only (their dictionary columns are zero in the other domain).

Pairing: the first ``n_paired = max(1, round(f n_train))`` training rows of the two domains are
pairs (same ``z``). The other rows are unpaired: in synthetic data domain B draws fresh concepts
(so the two unpaired sets are independent samples of the same distribution). Every held-out
test row is a pair and carries the ground truth used by the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig

MAPS = ("linear", "nonlinear")
MAGNITUDE_RANGE = (0.5, 1.5)


@dataclass(frozen=True)
class ConceptTruth:
    """What the intervention metrics need: the domain maps, the held-out concepts, the scales.

    ``present[i]`` marks the concepts domain ``i`` sees (all of them without domain-specific
    concepts); ``shared`` those both see. ``scales`` are the input normalisation of each domain
    (:func:`repdiag.alignment.train.normalise` sets them), so :meth:`change` is in the model's units.
    """

    maps: tuple[DomainMap, DomainMap]
    concepts: np.ndarray  # (n_test, n_total) held-out concepts
    present: tuple[np.ndarray, np.ndarray]  # boolean (n_total,) per domain
    scales: tuple[float, float] = (1.0, 1.0)

    @property
    def shared(self) -> np.ndarray:
        return np.flatnonzero(self.present[0] & self.present[1])

    def change(self, domain: int, rows: np.ndarray, concept: int) -> np.ndarray:
        """``(g_i(W_i z) - g_i(W_i z_{-c})) / s_i`` on held-out ``rows``: what concept c adds.

        ``z_{-c}`` is ``z`` with concept ``c`` set to 0; the noise is the same in both, so the
        counterfactual input is ``x_i - change``.
        """
        z = self.concepts[rows]
        ablated = z.copy()
        ablated[:, concept] = 0.0
        domain_map = self.maps[domain]
        return ((domain_map(z) - domain_map(ablated)) / self.scales[domain]).astype(np.float32)

    exact = True  # the true change of every concept is known (MCC is defined)

    def matching_set(self, domain: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and concepts the latents of ``domain`` are matched on: the held-out rows ``x``
        themselves (the concepts are known exactly, nothing is fitted)."""
        return x, self.concepts

    def rows(self, concept: int, max_rows: int) -> np.ndarray:
        """Held-out rows where ``concept`` is active (the first ``max_rows``)."""
        return np.flatnonzero(self.concepts[:, concept] > 0)[:max_rows]

    def readout(self, domain: int, concept: int) -> np.ndarray | None:
        """Changes are scored as whole vectors: no readout."""
        return None


@dataclass
class PairedData:
    """Two domains' training rows (the first ``n_paired`` rows are pairs) and held-out pairs."""

    train: tuple[np.ndarray, np.ndarray]
    n_paired: int
    test: tuple[np.ndarray, np.ndarray]
    test_labels: np.ndarray
    test_concepts: np.ndarray | None = None
    train_concepts: tuple[np.ndarray, np.ndarray] | None = None
    domains: tuple[str, str] = ("a", "b")
    truth: Any = None  # ConceptTruth, or repdiag.alignment.real_pairs.ProbeTruth
    info: dict = field(default_factory=dict)


def n_paired_rows(fraction: float, n_rows: int) -> int:
    """``max(1, round(fraction * n_rows))`` pairs for ``fraction > 0``; 0 for ``fraction == 0``."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"paired fraction must lie in [0, 1], got {fraction}")
    if fraction == 0.0:
        return 0
    return min(n_rows, max(1, round(fraction * n_rows)))


def concept_frequencies(n_concepts: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Power-law selection weights ``(r_c + 1)^(-exponent)`` over a random ranking, summing to 1."""
    ranks = rng.permutation(n_concepts)
    weights = (ranks + 1.0) ** (-float(exponent))
    return weights / weights.sum()


def sample_concepts(
    n: int,
    n_concepts: int,
    k_active: int,
    rng: np.random.Generator,
    *,
    frequencies: np.ndarray | None = None,
    correlation: float,
) -> np.ndarray:
    """``(n, n_concepts)`` codes with exactly ``k_active`` nonzero entries per row, U(0.5, 1.5).

    Without ``frequencies`` and correlation the active set is uniform (the ``easy`` testbed);
    otherwise it is the Gumbel-top-k draw of the module docstring.
    """
    if not 1 <= k_active <= n_concepts:
        raise ConfigError(f"k_active={k_active} must lie in [1, n_concepts={n_concepts}]")
    if not 0.0 <= correlation < 1.0:
        raise ConfigError(f"concept correlation must lie in [0, 1), got {correlation}")
    if frequencies is None and correlation == 0.0:
        active = np.argsort(rng.random((n, n_concepts), dtype=np.float32), axis=1)[:, :k_active]
    else:
        from scipy.special import ndtr

        log_p = np.log(frequencies) if frequencies is not None else np.zeros(n_concepts)
        shared = rng.standard_normal((n, (n_concepts + 1) // 2))
        own = rng.standard_normal((n, n_concepts))
        normal = np.sqrt(correlation) * np.repeat(shared, 2, axis=1)[:, :n_concepts]
        normal += np.sqrt(1.0 - correlation) * own
        uniform = np.clip(ndtr(normal), 1e-12, 1 - 1e-12)
        keys = log_p - np.log(-np.log(uniform))
        active = np.argsort(-keys, axis=1)[:, :k_active]
    z = np.zeros((n, n_concepts), dtype=np.float32)
    magnitudes = rng.uniform(*MAGNITUDE_RANGE, size=(n, k_active)).astype(np.float32)
    np.put_along_axis(z, active, magnitudes, axis=1)
    return z


@dataclass(frozen=True)
class DomainMap:
    """``x = g(W z)`` with unit-norm dictionary columns and an optional mild non-linearity."""

    dictionary: np.ndarray  # (d, n_concepts)
    kind: str
    nonlinearity: float

    def __call__(self, z: np.ndarray) -> np.ndarray:
        h = z @ self.dictionary.T
        if self.kind == "linear":
            return h
        return h + self.nonlinearity * np.tanh(h)


def random_map(
    d: int, n_concepts: int, kind: str, nonlinearity: float, rng: np.random.Generator
) -> DomainMap:
    if kind not in MAPS:
        raise ConfigError(f"unknown domain map {kind!r}; choose one of {', '.join(MAPS)}")
    w = rng.standard_normal((d, n_concepts))
    w /= np.linalg.norm(w, axis=0, keepdims=True)
    return DomainMap(w.astype(np.float32), kind, float(nonlinearity))


def _add_noise(x: np.ndarray, noise: float, rms: float, rng: np.random.Generator) -> np.ndarray:
    return x + np.float32(noise * rms) * rng.standard_normal(x.shape, dtype=np.float32)


@dataclass(frozen=True)
class SyntheticConcepts(FromConfig):
    """The synthetic concept space of the module docstring (``alignment.synthetic`` with the
    preset applied, :func:`repdiag.alignment.grid.preset_sections`): what every cell of a seed
    shares. The paired fraction and the seed are the cell's own (:func:`synthetic_pairs`)."""

    SECTION = "alignment.synthetic"

    n_concepts: int
    k_active: int
    dims: tuple[int, int]
    maps: tuple[str, str]
    nonlinearity: float
    noise: float
    n_train: int
    n_test: int
    frequency_exponent: float
    correlation: float
    n_specific: int

    def __post_init__(self) -> None:
        if len(self.dims) != 2 or len(self.maps) != 2:
            raise ConfigError("alignment.synthetic.dims and .maps must each list two domains")
        if self.n_specific < 0:
            raise ConfigError(f"alignment.synthetic.n_specific must be >= 0, got {self.n_specific}")
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        object.__setattr__(self, "maps", tuple(str(m) for m in self.maps))


def synthetic_pairs(space: SyntheticConcepts, paired_fraction: float, seed: int) -> PairedData:
    """Synthetic two-domain data with known concepts (see the module docstring for the model).

    Everything but the pairing depends only on ``seed``: the concept maps, the concepts of domain
    a and of the test split, and every noise draw (train and test noise have their own
    generators, scaled by an RMS that does not depend on the pairing). The paired fraction only
    decides which rows of domain b reuse domain a's concepts, so cells that differ only in the
    fraction see the same spaces and the same test split.
    """
    n_concepts, k_active, n_specific = space.n_concepts, space.k_active, space.n_specific
    n_train, n_test, noise = space.n_train, space.n_test, space.noise
    n_total = n_concepts + 2 * n_specific
    rng = np.random.default_rng([seed, 0])
    domain_maps = [
        random_map(d, n_total, kind, space.nonlinearity, rng)
        for d, kind in zip(space.dims, space.maps, strict=True)
    ]
    present = _hide_private_concepts(domain_maps, n_concepts, n_specific)
    frequencies = (
        concept_frequencies(n_total, space.frequency_exponent, rng)
        if space.frequency_exponent > 0
        else None
    )
    draw = dict(frequencies=frequencies, correlation=space.correlation)
    z_train = sample_concepts(n_train, n_total, k_active, rng, **draw)
    z_unpaired_b = sample_concepts(n_train, n_total, k_active, rng, **draw)
    z_test = sample_concepts(n_test, n_total, k_active, rng, **draw)
    n_paired = n_paired_rows(paired_fraction, n_train)
    z_b = np.concatenate([z_train[:n_paired], z_unpaired_b[n_paired:]])
    train_noise = np.random.default_rng([seed, 1])
    test_noise = np.random.default_rng([seed, 3])
    train, test = [], []
    for domain_map, z in zip(domain_maps, (z_train, z_b), strict=True):
        clean_train, clean_test = domain_map(z), domain_map(z_test)
        rms = float(np.sqrt(np.mean(domain_map(z_train) ** 2)))  # pairing-independent scale
        train.append(_add_noise(clean_train, noise, rms, train_noise).astype(np.float32))
        test.append(_add_noise(clean_test, noise, rms, test_noise).astype(np.float32))
    return PairedData(
        train=(train[0], train[1]),
        n_paired=n_paired,
        test=(test[0], test[1]),
        test_labels=dominant_concept(z_test),
        test_concepts=z_test,
        train_concepts=(z_train, z_b),
        domains=space.maps,
        truth=ConceptTruth(
            maps=(domain_maps[0], domain_maps[1]),
            concepts=z_test,
            present=(present[0], present[1]),
        ),
        info={
            "kind": "synthetic",
            "n_train": n_train,
            "n_test": n_test,
            "paired_fraction": paired_fraction,
            "n_concepts_total": n_total,
            "n_specific": n_specific,
            "frequency_exponent": space.frequency_exponent,
            "correlation": space.correlation,
        },
    )


def _hide_private_concepts(
    domain_maps: Sequence[Any], n_concepts: int, n_specific: int
) -> list[np.ndarray]:
    """Zero each domain's dictionary columns of the other domain's ``n_specific`` private
    concepts (shared concepts first, then a's private ones, then b's); returns the masks of the
    concepts each domain shows."""
    n_total = n_concepts + 2 * n_specific
    present = []
    for i, domain_map in enumerate(domain_maps):
        mask = np.ones(n_total, dtype=bool)
        other = slice(n_concepts + (1 - i) * n_specific, n_concepts + (2 - i) * n_specific)
        mask[other] = False
        domain_map.dictionary[:, ~mask] = 0.0  # the other domain's private concepts are invisible
        present.append(mask)
    return present


def dominant_concept(z: np.ndarray) -> np.ndarray:
    """Probe task of the synthetic data: the index of each sample's largest concept."""
    return np.argmax(z, axis=1).astype(np.int64)
