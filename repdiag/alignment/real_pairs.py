"""Real-embedding pairs for the alignment study: two encoders' embeddings of the same images.

Rows of two embedding stores are paired by image id. One seed draws the split: a random
``test_fraction`` of the images (at most ``max_images``) are the held-out pairs, the evaluation
rows; the rest are training images. The first ``n_paired = max(1, round(f n_train))`` training
images are anchor pairs; the other training images are split into two disjoint halves, one per
domain, so that no hidden correspondence exists.

Known image attributes ("shape s sits in slot k", :func:`repdiag.binding.store.slot_attributes`)
stand in for concepts (:class:`ProbeTruth`). Their effects and probes are fitted on the
*training images* of the seed's split, in each domain's own embeddings, and never on a held-out
row: the intervention metrics score only held-out rows, with effects and probes that did not
see them. Controls (``control="rotation"``, ``"shuffle"``) give every metric a ceiling and a floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from repdiag.alignment.concepts import PairedData, n_paired_rows
from repdiag.core.errors import StoreError

MIN_CLASS_ROWS = 5
MIN_PROBE_ACCURACY = 0.7
SHRINKAGE = 0.1


CONTROLS = ("none", "rotation", "shuffle", "exact")
"""The real-pair controls :func:`embedding_pairs` applies to domain b (``alignment.real.pairs``'
``control``; ``exact`` is the rotation control's data for the exact translator)."""


@dataclass(frozen=True)
class PairSplit:
    """Which rows two stores contribute and how they are split: the layer read, the fraction of
    training images given as pairs, the held-out fraction, the seed of the split (and of the
    rotation and shuffle), the image sets read (None: all) and a cap on the images used."""

    layer: str
    paired_fraction: float
    test_fraction: float
    seed: int
    image_sets: Sequence[str] | None = None
    max_images: int | None = None


@dataclass(frozen=True)
class ProbeTruth:
    """Known attributes of real images standing in for concepts (the real-embedding path).

    ``concepts`` are 0/1 indicators of the held-out (evaluation) rows. On each domain's fit
    rows (``fit_inputs``, ``fit_concepts``: the training images, never an evaluation row) each
    domain gets, per attribute ``a``, its *effect* ``t_i(a) = mean(x_i | a) - mean(x_i | not a)``
    and a linear *probe* ``w_i(a)`` (a shrinkage linear discriminant on inputs centred and divided
    by one global scale, folded back to input units: exactly equivariant under a rotation of the
    domain), and latents are matched to attributes there.
    ``fit_accuracy`` is the probe's balanced accuracy cross-fitted between two random halves of
    the fit rows (fit on one, scored on the other, both ways, averaged); ``stability`` the
    cosine of the effects fitted on the two halves. An attribute is scored in a domain
    (``present``) when each half has ``MIN_CLASS_ROWS`` rows of each class and ``fit_accuracy``
    reaches ``min_accuracy``. ``probe_accuracy`` (the full probe on the evaluation rows) is
    reported, never used to select. No selection reads a trained alignment model.
    """

    names: tuple[str, ...]
    concepts: np.ndarray  # (n_test, n_attributes) 0/1
    present: tuple[np.ndarray, np.ndarray]
    effects: tuple[np.ndarray, np.ndarray]  # (n_attributes, d_i), input units
    probes: tuple[np.ndarray, np.ndarray]  # (n_attributes, d_i), input units
    probe_accuracy: tuple[np.ndarray, np.ndarray]  # (n_attributes,), evaluation rows
    fit_accuracy: tuple[np.ndarray, np.ndarray]  # (n_attributes,), cross-fitted on fit rows
    stability: tuple[np.ndarray, np.ndarray]  # (n_attributes,), split-half cosine of effects
    fit_inputs: tuple[np.ndarray, np.ndarray]  # (n_fit_i, d_i), input units
    fit_concepts: tuple[np.ndarray, np.ndarray]  # (n_fit_i, n_attributes) 0/1
    min_accuracy: float = MIN_PROBE_ACCURACY
    scales: tuple[float, float] = (1.0, 1.0)

    exact = False

    @property
    def shared(self) -> np.ndarray:
        return np.flatnonzero(self.present[0] & self.present[1])

    @property
    def eval_rows(self) -> np.ndarray:
        """Every held-out row is an evaluation row (the fit rows are training images)."""
        return np.arange(len(self.concepts))

    def rows(self, concept: int, max_rows: int) -> np.ndarray:
        """Evaluation rows that have attribute ``concept`` (the first ``max_rows``)."""
        return np.flatnonzero(self.concepts[:, concept] > 0)[:max_rows]

    def matching_set(self, domain: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inputs (model units) and attributes that ``domain``'s latents are matched on: its
        fit rows, not the evaluation rows ``x``."""
        fit = np.asarray(self.fit_inputs[domain], dtype=np.float32) / np.float32(
            self.scales[domain]
        )
        return fit, self.fit_concepts[domain]

    def change(self, domain: int, rows: np.ndarray, concept: int) -> np.ndarray:
        """``t_i(a) / s_i`` on every row: the attribute's mean effect in the model's units."""
        effect = self.effects[domain][concept] / self.scales[domain]
        return np.broadcast_to(effect, (len(rows), effect.shape[0])).astype(np.float32)

    def readout(self, domain: int, concept: int) -> np.ndarray:
        """The probe ``w_i(a) s_i`` in the model's units (so ``w . x`` is unchanged)."""
        return (self.probes[domain][concept] * self.scales[domain]).astype(np.float64)


def global_scale(x: np.ndarray) -> float:
    """``sqrt(sum ||x_r - mean(x)||^2 / (n d))``: one scale for every coordinate, so that an
    orthonormal change of basis of ``x`` leaves it unchanged (a per-coordinate z-score does not)."""
    centred = np.asarray(x, dtype=np.float64) - np.mean(x, axis=0)
    return float(np.sqrt(np.mean(centred**2))) + 1e-12


def standardise(x: np.ndarray) -> np.ndarray:
    """``(x - mean(x)) / global_scale(x)``: rotating ``x`` rotates the result along."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean(0)) / global_scale(x)


def _class_means(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean(x | a), mean(x | not a))`` of every attribute (columns of boolean ``y``)."""
    n_in = np.maximum(y.sum(0), 1)[:, None]
    n_out = np.maximum((~y).sum(0), 1)[:, None]
    return (y.T @ x) / n_in, ((~y).T @ x) / n_out


def _discriminants(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shrinkage linear discriminants of every attribute at once: ``w = (S + lambda I)^-1
    (mean(z | a) - mean(z | not a))`` with ``S`` the covariance of ``z`` and ``lambda`` =
    ``SHRINKAGE`` (the mean eigenvalue of ``S`` is 1 after :func:`standardise`), and the
    threshold half-way between the two class means' scores. Rotating ``z`` rotates ``w``
    exactly (no iterative solver)."""
    inside, outside = _class_means(z, y)
    centred = z - z.mean(0)
    covariance = centred.T @ centred / len(z)
    w = np.linalg.solve(covariance + SHRINKAGE * np.eye(z.shape[1]), (inside - outside).T).T
    return w, 0.5 * np.sum(w * (inside + outside), axis=1)


def _balanced_accuracy(
    z: np.ndarray, y: np.ndarray, w: np.ndarray, threshold: np.ndarray
) -> np.ndarray:
    """Per attribute, ``(TPR + TNR) / 2`` of ``w . z > threshold`` (NaN without both classes)."""
    predicted = z @ w.T > threshold
    with np.errstate(divide="ignore", invalid="ignore"):
        tpr = (predicted & y).sum(0) / y.sum(0)
        tnr = (~predicted & ~y).sum(0) / (~y).sum(0)
    return 0.5 * (tpr + tnr)


def _row_cosines(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norms > 0, np.sum(u * v, axis=1) / norms, np.nan)


def _fit_domain(
    fit_x: np.ndarray,
    fit_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    halves: tuple[np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """Effects, probes, cross-fitted and held-out balanced accuracy and split-half stability of
    every attribute in one domain (see :class:`ProbeTruth`); NaN / 0 where not usable."""
    fit_x = np.asarray(fit_x, dtype=np.float64)
    mean, scale = fit_x.mean(0), global_scale(fit_x)
    z_fit, z_test = (fit_x - mean) / scale, (np.asarray(test_x, dtype=np.float64) - mean) / scale
    counts = [np.minimum(fit_y[h].sum(0), (~fit_y[h]).sum(0)) for h in halves]
    usable = (counts[0] >= MIN_CLASS_ROWS) & (counts[1] >= MIN_CLASS_ROWS)
    half_effects, crossed = [], []
    for h, other in (halves, halves[::-1]):
        inside, outside = _class_means(fit_x[h], fit_y[h])
        half_effects.append(inside - outside)
        w, threshold = _discriminants(z_fit[h], fit_y[h])
        crossed.append(_balanced_accuracy(z_fit[other], fit_y[other], w, threshold))
    inside, outside = _class_means(fit_x, fit_y)
    w, threshold = _discriminants(z_fit, fit_y)
    out = {
        "usable": usable,
        "effects": np.where(usable[:, None], inside - outside, 0.0),
        "probes": np.where(usable[:, None], w / scale, 0.0),
        "fit": np.mean(crossed, axis=0),
        "test": _balanced_accuracy(z_test, test_y, w, threshold),
        "stability": _row_cosines(*half_effects),
    }
    for key in ("fit", "test", "stability"):
        out[key] = np.where(usable, out[key], np.nan)
    return out


def probe_truth(
    fit: Sequence[np.ndarray],
    fit_indicators: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    indicators: np.ndarray,
    names: Sequence[str],
    *,
    min_accuracy: float = MIN_PROBE_ACCURACY,
    seed: int,
) -> ProbeTruth:
    """Effects and probes of every attribute, fitted on each domain's ``fit`` rows (with their
    ``fit_indicators``) and never on the held-out ``test`` rows (``indicators``); halves of the
    fit rows drawn from ``seed``; scored where cross-fitted balanced accuracy >= ``min_accuracy``
    in both domains (:class:`ProbeTruth`)."""
    indicators = np.asarray(indicators, dtype=np.float32)
    fitted = []
    for x, y, x_test in zip(fit, fit_indicators, test, strict=True):
        y = np.asarray(y) > 0
        order = np.random.default_rng([seed, 4]).permutation(len(y))
        halves = (np.sort(order[: len(y) // 2]), np.sort(order[len(y) // 2 :]))
        fitted.append(_fit_domain(x, y, x_test, indicators > 0, halves))
    present = [f["usable"] & (np.nan_to_num(f["fit"]) >= min_accuracy) for f in fitted]

    def pair(key: str, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
        return (fitted[0][key].astype(dtype), fitted[1][key].astype(dtype))

    return ProbeTruth(
        names=tuple(names),
        concepts=indicators,
        present=(present[0], present[1]),
        effects=pair("effects", np.float32),
        probes=pair("probes"),
        probe_accuracy=pair("test"),
        fit_accuracy=pair("fit"),
        stability=pair("stability"),
        fit_inputs=(np.asarray(fit[0]), np.asarray(fit[1])),
        fit_concepts=(
            np.asarray(fit_indicators[0], dtype=np.float32),
            np.asarray(fit_indicators[1], dtype=np.float32),
        ),
        min_accuracy=float(min_accuracy),
    )


def read_layer(
    path: str | Path, layer: str, image_sets: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Image ids and ``emb_<layer>`` rows of one embedding store, optionally only some image sets."""
    # imported here: the Snakefile's config check imports the alignment grid, and zarr costs 0.6 s
    from repdiag.core.store import open_store

    name = f"emb_{layer}"
    ds = open_store(path, required=[name])
    if "image" not in ds.coords:
        raise StoreError(f"store {path}: variable {name!r} has no 'image' coordinate of image ids")
    ids = np.asarray(ds["image"].values).astype(str)
    values = np.asarray(ds[name].values, dtype=np.float32)
    if values.ndim != 2 or values.shape[0] != ids.shape[0]:
        raise StoreError(f"store {path}: {name!r} must be (image, dim), got shape {values.shape}")
    if image_sets:
        if "image_set" not in ds.coords:
            raise StoreError(
                f"store {path}: no 'image_set' coordinate to select {list(image_sets)}"
            )
        keep = np.isin(np.asarray(ds["image_set"].values).astype(str), list(image_sets))
        ids, values = ids[keep], values[keep]
    return ids, values


def kmeans_labels(x: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """Pseudo-labels for the probe on real data: k-means clusters (scikit-learn, k-means++)."""
    from sklearn.cluster import KMeans

    n_clusters = max(2, min(n_clusters, len(x) // 2))
    return (
        KMeans(n_clusters=n_clusters, n_init=4, random_state=seed).fit_predict(x).astype(np.int64)
    )


def random_rotation(dim: int, seed: int) -> np.ndarray:
    """A Haar-distributed orthogonal (dim, dim) matrix: Q of the QR of a Gaussian draw, with
    the signs of R's diagonal moved into Q (Mezzadri 2007), float64."""
    gaussian = np.random.default_rng([seed, 3]).standard_normal((dim, dim))
    q, r = np.linalg.qr(gaussian)
    return q * np.sign(np.diag(r))


def _split(n_common: int, seed: int, test_fraction: float, max_images: int | None):
    """``(test_rows, train_rows)``: a seeded permutation of the common images, held out first."""
    order = np.random.default_rng([seed, 2]).permutation(n_common)
    if max_images:
        order = order[:max_images]
    n_test = max(8, round(test_fraction * len(order)))
    return order[:n_test], order[n_test:]


def _training_rows(
    train_rows: np.ndarray, n_paired: int, seed: int, shuffle_b: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Each domain's training images: the ``n_paired`` anchor pairs first, then its own half of
    the others; with ``shuffle_b`` domain b's rows permuted (seeded), so its pairs are wrong."""
    unpaired = train_rows[n_paired:]
    half = len(unpaired) // 2
    rows_a = np.concatenate([train_rows[:n_paired], unpaired[:half]])
    rows_b = np.concatenate([train_rows[:n_paired], unpaired[half:]])
    if shuffle_b:
        rows_b = np.random.default_rng([seed, 5]).permutation(rows_b)
    return rows_a, rows_b


def _attribute_truth(
    attributes: tuple[np.ndarray, Sequence[str], np.ndarray],
    images: tuple[np.ndarray, np.ndarray],
    fit: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    min_accuracy: float,
    seed: int,
) -> ProbeTruth:
    """:func:`probe_truth` of the training images (``images[1]``) against the held-out ones."""
    attribute_ids, names, indicators = attributes
    lookup = {str(image): row for row, image in enumerate(np.asarray(attribute_ids).astype(str))}
    test_ids, fit_ids = images
    table = np.asarray(indicators)
    fit_y = table[[lookup[str(i)] for i in fit_ids]]
    test_y = table[[lookup[str(i)] for i in test_ids]]
    return probe_truth(
        fit, (fit_y, fit_y), test, test_y, names, min_accuracy=min_accuracy, seed=seed
    )


def embedding_pairs(
    path_a: str | Path,
    path_b: str | Path,
    split: PairSplit,
    *,
    control: str = "none",
    n_clusters: int,
    attributes: tuple[np.ndarray, Sequence[str], np.ndarray] | None = None,
    min_accuracy: float = MIN_PROBE_ACCURACY,
    reuse_truth: ProbeTruth | None = None,
) -> PairedData:
    """Two encoders' embeddings of the same images, paired by image id (module docstring).

    Probe labels of the held-out pairs are k-means clusters of both domains' embeddings, each
    :func:`standardise`\\ d, concatenated, so neither domain defines the task alone. ``attributes``
    ``(ids, names, indicators)`` restricts the images to those with known attributes and gives
    the held-out pairs a :class:`ProbeTruth` (``truth``) fitted on the training images. The
    split depends only on ``seed``, ``test_fraction`` and ``max_images``, so a caller looping
    over paired fractions can pass the first call's truth as ``reuse_truth``. ``control``
    (:data:`CONTROLS`): ``rotation`` (and ``exact``, the exact translator's data) expresses
    domain b in a Haar-random orthonormal basis (drawn from ``seed``): with ``path_b = path_a``
    an exact linear alignment exists, the positive control. ``shuffle`` also permutes domain b's
    training rows (seeded): the anchor pairs are wrong while the held-out pairs, the attributes
    and the fit rows stay right, the negative control.
    """
    if control not in CONTROLS:
        raise ValueError(f"unknown real-pair control {control!r}; choose one of {CONTROLS}")
    layer, seed = split.layer, split.seed
    ids_a, x_a = read_layer(path_a, layer, split.image_sets)
    ids_b, x_b = read_layer(path_b, layer, split.image_sets)
    if control != "none":
        x_b = x_b @ random_rotation(x_b.shape[1], seed).astype(x_b.dtype)
    n_without_attributes = 0
    if attributes is not None:
        known = np.isin(ids_a, np.asarray(attributes[0]).astype(str))
        n_without_attributes = int((~known).sum())
        ids_a, x_a = ids_a[known], x_a[known]
    common, rows_a, rows_b = np.intersect1d(ids_a, ids_b, assume_unique=False, return_indices=True)
    if len(common) < 16:
        raise StoreError(
            f"{path_a} and {path_b} share only {len(common)} image ids (need >= 16); "
            "they must embed the same image sets"
        )
    test_rows, train_rows = _split(len(common), seed, split.test_fraction, split.max_images)
    n_paired = n_paired_rows(split.paired_fraction, len(train_rows))
    shuffled = control == "shuffle"
    rows_train_a, rows_train_b = _training_rows(train_rows, n_paired, seed, shuffled)
    test = (x_a[rows_a[test_rows]], x_b[rows_b[test_rows]])
    labels = kmeans_labels(np.concatenate([standardise(t) for t in test], axis=1), n_clusters, seed)
    truth = reuse_truth
    if attributes is not None and truth is None:
        fit = (x_a[rows_a[train_rows]], x_b[rows_b[train_rows]])
        images = (common[test_rows], common[train_rows])
        truth = _attribute_truth(attributes, images, fit, test, min_accuracy, seed)
    return PairedData(
        train=(x_a[rows_a[rows_train_a]], x_b[rows_b[rows_train_b]]),
        n_paired=n_paired,
        test=test,
        test_labels=labels,
        test_concepts=None,
        domains=(str(Path(path_a).stem), str(Path(path_b).stem)),
        truth=truth,
        info={
            "kind": "real",
            "seed": seed,
            "n_without_attributes": n_without_attributes,
            "attributes": attribute_info(truth),
            "decodable_accuracy": None if truth is None else truth.min_accuracy,
            "layer": layer,
            "paired_fraction": split.paired_fraction,
            "n_common_images": len(common),
            "n_used": len(test_rows) + len(train_rows),
            "n_test": len(test_rows),
            "n_fit": len(train_rows),
            "test_ids_head": common[test_rows[:5]].tolist(),
        },
    )


def _rounded(values: Sequence[float], a: int) -> list[float | None]:
    return [None if np.isnan(v[a]) else round(float(v[a]), 4) for v in values]


def attribute_info(truth: ProbeTruth | None) -> dict | None:
    """Per attribute: whether it is scored, each domain's cross-fitted balanced accuracy on the
    fit rows (``fit_accuracy``, what the bar reads), the full probe's balanced accuracy on the
    held-out rows (``probe_accuracy``, reported only) and the split-half cosine of its effect
    (``effect_stability``)."""
    if truth is None:
        return None
    return {
        name: {
            "scored": bool(truth.present[0][a] and truth.present[1][a]),
            "fit_accuracy": _rounded(truth.fit_accuracy, a),
            "probe_accuracy": _rounded(truth.probe_accuracy, a),
            "effect_stability": _rounded(truth.stability, a),
        }
        for a, name in enumerate(truth.names)
    }


def effect_stability(truth: ProbeTruth | None) -> dict[str, float | None]:
    """Median and minimum split-half cosine of the mean effects over the scored attributes and
    both domains (None without a scored attribute), and how many attributes are scored."""
    if truth is None:
        return {"effect_stability": None, "effect_stability_min": None, "n_attributes_scored": None}
    shared = truth.shared
    values = np.concatenate([s[shared] for s in truth.stability])
    values = values[np.isfinite(values)]
    return {
        "effect_stability": float(np.median(values)) if values.size else None,
        "effect_stability_min": float(values.min()) if values.size else None,
        "n_attributes_scored": len(shared),
    }
