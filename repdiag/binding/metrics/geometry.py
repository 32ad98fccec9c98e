"""Geometry metrics of a set of embeddings: global and local isotropy, participation ratio, rank.

Every metric takes an ``(n, d)`` array of embeddings (one row per image) and works on the
spectrum of its centred covariance ``C = Xc^T Xc / (n - 1)``, eigenvalues ``l_1 >= ... >= l_D >= 0``
with ``D = d``. The spectrum is computed with ``eigvalsh`` on the smaller of the covariance
``(d, d)`` and the Gram matrix ``Xc Xc^T / (n - 1)`` ``(n, n)``, which share their non-zero
eigenvalues. All metrics are invariant to the scale of the embeddings.

A collapsed set (zero total variance) has no direction to be spread along: every metric is 0 for
it, so a dead layer gives finite numbers rather than NaN.

References: participation ratio (Gao et al. 2017, "A theory of multineuronal dimensionality";
Recanatesi et al. 2019), isotropy as the share of variance outside the first principal
component (the binding paper's G.Iso / L.Iso, "Global geometry is not enough for vision
representations"), effective rank (Roy & Vetterli 2007; RankMe, Garrido et al. 2023).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Eigenvalues below this fraction of the largest are rounding noise of eigvalsh, not variance.
RELATIVE_EIGEN_TOL = 1e-10
# Neighbourhood blocks are processed in chunks of about this many float64 values.
CHUNK_VALUES = 4_000_000


def _as_matrix(x: np.ndarray, name: str = "x") -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be an (n, d) array of embeddings, got shape {x.shape}")
    if x.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 embeddings for a covariance, got {x.shape[0]}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return x


def _clean(eigenvalues: np.ndarray) -> np.ndarray:
    """Sort descending along the last axis and zero the rounding noise (tiny or negative values)."""
    values = -np.sort(-eigenvalues, axis=-1)
    top = np.maximum(values[..., :1], 0.0)
    return np.where(values > RELATIVE_EIGEN_TOL * top, values, 0.0)


def covariance_spectrum(x: np.ndarray) -> np.ndarray:
    """Eigenvalues of the centred covariance of ``x`` (n, d), descending, length ``min(n, d)``.

    ``C = Xc^T Xc / (n - 1)``; computed on the Gram matrix when ``n < d`` (same non-zero spectrum).
    """
    x = _as_matrix(x)
    centred = x - x.mean(axis=0)
    n, d = centred.shape
    small = centred @ centred.T if n < d else centred.T @ centred
    return _clean(np.linalg.eigvalsh(small / (n - 1)))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` with 0 where the denominator is 0 (a collapsed set)."""
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, numerator / safe, 0.0)


def participation_ratio_of_spectrum(eigenvalues: np.ndarray) -> np.ndarray:
    """PR = (sum_i l_i)^2 / sum_i l_i^2 over the last axis (Gao et al. 2017); 0 for a zero spectrum."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    return _ratio(values.sum(axis=-1) ** 2, (values**2).sum(axis=-1))


def isotropy_of_spectrum(eigenvalues: np.ndarray) -> np.ndarray:
    """Iso = 1 - l_1 / sum_i l_i over the last axis (share of variance outside the top direction)."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    total = values.sum(axis=-1)
    return np.where(total > 0, 1.0 - _ratio(values.max(axis=-1), total), 0.0)


def effective_rank_of_spectrum(values: np.ndarray) -> np.ndarray:
    """erank = exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j over the last axis (Roy & Vetterli 2007).

    ``r`` equal non-zero values give exactly ``r``; zero entries contribute nothing; an all-zero
    spectrum gives 0.
    """
    values = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    total = values.sum(axis=-1, keepdims=True)
    p = _ratio(values, total)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.where(total[..., 0] > 0, np.exp(-plogp.sum(axis=-1)), 0.0)


def global_participation_ratio(x: np.ndarray) -> float:
    """G.PR = (sum l)^2 / (D * sum l^2), ``D = d`` (the binding paper's G.PR; in (0, 1]).

    Isotropic data gives 1, rank-one data 1/D. With ``n <= d`` at most ``n - 1`` eigenvalues are
    non-zero, so G.PR cannot exceed ``(n - 1) / d``: use a reference set larger than ``d``.
    """
    x = _as_matrix(x)
    return float(participation_ratio_of_spectrum(covariance_spectrum(x)) / x.shape[1])


def global_isotropy(x: np.ndarray) -> float:
    """G.Iso = 1 - l_1 / sum l on the centred covariance spectrum (binding paper's G.Iso).

    Isotropic data gives 1 - 1/D, rank-one data 0.
    """
    return float(isotropy_of_spectrum(covariance_spectrum(x)))


def participation_ratio(x: np.ndarray) -> float:
    """PR = (sum l)^2 / sum l^2 on the covariance spectrum, without the 1/D normalisation.

    The number of dimensions the variance is spread over (Gao et al. 2017), in [1, D].
    """
    return float(participation_ratio_of_spectrum(covariance_spectrum(x)))


def effective_rank(x: np.ndarray) -> float:
    """Effective rank exp(H(p)), p_i = s_i / sum s, s the singular values of the centred data.

    As RankMe (Garrido et al. 2023) and Roy & Vetterli (2007), on singular values ``s_i``
    (= sqrt of the covariance eigenvalues up to a constant), here of the centred embeddings so
    that it sees the same spectrum as the other metrics. In [1, min(n, d)].
    """
    return float(effective_rank_of_spectrum(np.sqrt(covariance_spectrum(x))))


def knn_indices(
    points: np.ndarray,
    reference: np.ndarray,
    k: int,
    *,
    metric: str = "euclidean",
    exclude_self: bool = False,
) -> np.ndarray:
    """Indices (n, k) of the ``k`` nearest rows of ``reference`` to each row of ``points``.

    ``metric`` is ``euclidean`` or ``cosine``. ``exclude_self`` drops each point's own row when
    ``points`` is ``reference`` (row i of points is row i of reference). Neighbours are sorted
    nearest first; which of several equidistant points at the k-th place is kept is unspecified.
    """
    points = np.asarray(points, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    available = reference.shape[0] - int(exclude_self)
    if not 1 <= k <= available:
        raise ValueError(f"k={k} nearest neighbours need k <= {available} reference points")
    if metric == "cosine":
        points, reference = _unit_rows(points), _unit_rows(reference)
    elif metric != "euclidean":
        raise ValueError(f"unknown neighbour metric {metric!r}; use 'euclidean' or 'cosine'")
    out = np.empty((points.shape[0], k), dtype=np.int64)
    ref_sq = (reference**2).sum(axis=1)
    step = max(1, CHUNK_VALUES // max(reference.shape[0], 1))
    for start in range(0, points.shape[0], step):
        block = points[start : start + step]
        # Squared distances up to a per-row constant: |r|^2 - 2 <p, r> ranks like |p - r|^2.
        dist = ref_sq[None, :] - 2.0 * block @ reference.T
        if exclude_self:
            rows = np.arange(block.shape[0])
            dist[rows, start + rows] = np.inf
        part = np.argpartition(dist, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(dist, part, axis=1), axis=1, kind="stable")
        out[start : start + step] = np.take_along_axis(part, order, axis=1)
    return out


def _unit_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def neighbourhood_spectra(x: np.ndarray, k: int) -> np.ndarray:
    """Covariance spectra (n, min(k, d)) of each point's ``k`` nearest other points (Euclidean).

    Batched ``eigvalsh`` on the (k, k) Gram matrices of the centred neighbourhoods (or the (d, d)
    covariances when ``d < k``), chunked to bound memory.
    """
    x = _as_matrix(x)
    if k < 2:
        raise ValueError(f"local isotropy needs k >= 2 neighbours, got k={k}")
    neighbours = knn_indices(x, x, k, exclude_self=True)
    n, d = x.shape
    spectra = np.empty((n, min(k, d)))
    step = max(1, CHUNK_VALUES // (k * d))
    for start in range(0, n, step):
        block = x[neighbours[start : start + step]]  # (b, k, d)
        block = block - block.mean(axis=1, keepdims=True)
        if k <= d:
            small = block @ block.transpose(0, 2, 1)
        else:
            small = block.transpose(0, 2, 1) @ block
        spectra[start : start + step] = _clean(np.linalg.eigvalsh(small / (k - 1)))
    return spectra


def local_isotropy(x: np.ndarray, k: int) -> float:
    """L.Iso(k) = mean over points i of 1 - l_1(N_k(i)) / sum l(N_k(i)) (binding paper's L.Iso).

    ``N_k(i)`` are the ``k`` nearest other points of point ``i`` (Euclidean), and ``l`` the
    eigenvalues of their centred covariance. Neighbourhoods with zero variance (duplicates) count
    as 0, like every collapsed set.
    """
    return float(isotropy_of_spectrum(neighbourhood_spectra(x, k)).mean())


def local_isotropy_profile(x: np.ndarray, ks: Iterable[int]) -> dict[str, float]:
    """``{str(k): L.Iso(k)}`` for every ``k`` in ``ks`` (JSON keys are strings)."""
    return {str(int(k)): local_isotropy(x, int(k)) for k in ks}


def geometry_metrics(x: np.ndarray, l_iso_k: Iterable[int]) -> dict[str, object]:
    """Every geometry metric of ``x`` (n, d), keyed as in ``results/metrics/<model>.json``; L.Iso
    at each neighbourhood size of ``l_iso_k`` (``metrics.geometry.l_iso_k``)."""
    x = _as_matrix(x)
    spectrum = covariance_spectrum(x)
    return {
        "g_pr": float(participation_ratio_of_spectrum(spectrum) / x.shape[1]),
        "g_iso": float(isotropy_of_spectrum(spectrum)),
        "l_iso": local_isotropy_profile(x, l_iso_k),
        "effective_rank": float(effective_rank_of_spectrum(np.sqrt(spectrum))),
        "participation_ratio": float(participation_ratio_of_spectrum(spectrum)),
    }
