"""How well a representation h = f(g(z)) recovers the latents z (identifiability metrics).

All three take arrays of shape (n, d_h) and (n, d_z) with rows paired by sample.

* :func:`linear_r2` -- linear identifiability (Zimmermann et al. 2021; Hyvarinen & Morioka 2016):
  the coefficient of determination of an affine regression z ~ B h + c fitted on a training split
  and scored on the held-out split, averaged over the latent dimensions,
  R^2 = (1/d_z) sum_j [1 - sum_i (z_ij - zhat_ij)^2 / sum_i (z_ij - mean_i z_ij)^2].
* :func:`mcc` -- mean correlation coefficient: the mean of |corr(h_a, z_b)| over the one-to-one
  matching of dimensions that maximises it (Hungarian algorithm on the absolute Pearson matrix).
* :func:`ape` -- angle preservation error: mean over the n (n - 1) / 2 unordered pairs i < j
  (diagonal excluded) of |<z_i, z_j> - <h_i, h_j>|; zero exactly when f o g preserves inner
  products (an orthogonal map on the sphere). The paper's summary (``../shared/seeds/002``)
  names APE without a formula; pairs i < j is the project's definition. The other common
  reading, sum over all n^2 ordered pairs halved, (1 / (2 n^2)) sum_(i,j) |...|, equals
  (n - 1) / (2 n) times ours, i.e. about half of it: compare APE across sources only after
  checking which one they use.

:func:`identifiability_metrics` also reports the held-out R^2 of each latent coordinate
(``r2_z1`` ... ``r2_zd``), whose mean is ``r2``: under restricted support with z_1 fixed in
positive pairs, a collapse keeps r2_z1 and loses the perturbed coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.optimize import linear_sum_assignment

from repdiag.core.settings import FromConfig


@dataclass(frozen=True)
class HeldOutSettings(FromConfig):
    """``identifiability.evaluation``: how many evaluation latents (uniform on the sphere, the
    same for every cell, drawn from ``seed``), and the share of them that fits R^2's linear map
    (MCC and APE use the rest, split with the same ``seed``)."""

    SECTION: ClassVar[str] = "identifiability.evaluation"
    n_samples: int
    train_fraction: float
    seed: int


def _paired(h: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h, z = np.asarray(h, dtype=np.float64), np.asarray(z, dtype=np.float64)
    if h.ndim != 2 or z.ndim != 2 or len(h) != len(z):
        raise ValueError(
            f"h and z must be (n, d) arrays with the same n, got {h.shape} and {z.shape}"
        )
    return h, z


def split_indices(n: int, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random split of range(n) into (train, test) with round(train_fraction n) train rows."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    cut = round(train_fraction * n)
    if cut < 2 or n - cut < 2:
        raise ValueError(f"{n} samples are too few for a train/test split at {train_fraction}")
    return order[:cut], order[cut:]


def r2_scores(
    h_train: np.ndarray, z_train: np.ndarray, h_test: np.ndarray, z_test: np.ndarray
) -> np.ndarray:
    """Per-dimension held-out R^2 of the least-squares affine map h -> z fitted on the train rows."""
    h_train, z_train = _paired(h_train, z_train)
    h_test, z_test = _paired(h_test, z_test)
    design = np.hstack([h_train, np.ones((len(h_train), 1))])
    coef, *_ = np.linalg.lstsq(design, z_train, rcond=None)
    predicted = np.hstack([h_test, np.ones((len(h_test), 1))]) @ coef
    residual = ((z_test - predicted) ** 2).sum(axis=0)
    total = ((z_test - z_test.mean(axis=0)) ** 2).sum(axis=0)
    return 1.0 - residual / total


def linear_r2(h: np.ndarray, z: np.ndarray, train_fraction: float, seed: int) -> float:
    """Held-out linear identifiability R^2, averaged over the latent dimensions (module docstring)."""
    h, z = _paired(h, z)
    train, test = split_indices(len(h), train_fraction, seed)
    return float(r2_scores(h[train], z[train], h[test], z[test]).mean())


def correlation_matrix(h: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Pearson correlations C_ab = corr(h_a, z_b), shape (d_h, d_z); constant columns give 0."""
    h, z = _paired(h, z)
    hc, zc = h - h.mean(axis=0), z - z.mean(axis=0)
    hn, zn = np.linalg.norm(hc, axis=0), np.linalg.norm(zc, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (hc.T @ zc) / np.outer(hn, zn)
    return np.nan_to_num(corr, nan=0.0)


def mcc(h: np.ndarray, z: np.ndarray) -> float:
    """Mean |Pearson correlation| over the Hungarian matching of h- to z-dimensions."""
    corr = np.abs(correlation_matrix(h, z))
    rows, cols = linear_sum_assignment(corr, maximize=True)
    return float(corr[rows, cols].mean())


def ape(h: np.ndarray, z: np.ndarray) -> float:
    """APE = (2 / (n (n - 1))) sum_(i<j) |<z_i, z_j> - <h_i, h_j>| (module docstring)."""
    h, z = _paired(h, z)
    n = len(h)
    if n < 2:
        raise ValueError("APE needs at least two samples")
    upper = np.triu_indices(n, k=1)
    return float(np.abs((z @ z.T)[upper] - (h @ h.T)[upper]).mean())


def identifiability_metrics(
    h: np.ndarray, z: np.ndarray, train_fraction: float, seed: int
) -> dict[str, float]:
    """{"r2", "mcc", "ape", "r2_z1", ..., "r2_zd"}: R^2 (mean and per latent coordinate) from
    the split, MCC and APE on the held-out rows."""
    h, z = _paired(h, z)
    train, test = split_indices(len(h), train_fraction, seed)
    per_dim = r2_scores(h[train], z[train], h[test], z[test])
    return {
        "r2": float(per_dim.mean()),
        "mcc": mcc(h[test], z[test]),
        "ape": ape(h[test], z[test]),
        **{f"r2_z{j + 1}": float(value) for j, value in enumerate(per_dim)},
    }
