"""Paired data for the alignment study: a synthetic concept space, or two encoders' embeddings.

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
(so the two unpaired sets are independent samples of the same distribution); in real data the
remaining images are split into two disjoint halves, one per domain, so that no hidden
correspondence exists. Every held-out test row is a pair and carries the ground truth used by
the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from repdiag.core.errors import ConfigError, StoreError

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

    @property
    def fit_rows(self) -> slice:
        """Held-out rows the latent of each concept is identified on: all of them."""
        return slice(None)

    def rows(self, concept: int, max_rows: int) -> np.ndarray:
        """Held-out rows where ``concept`` is active (the first ``max_rows``)."""
        return np.flatnonzero(self.concepts[:, concept] > 0)[:max_rows]

    def readout(self, domain: int, concept: int) -> np.ndarray | None:
        """Changes are scored as whole vectors: no readout."""
        return None


@dataclass(frozen=True)
class ProbeTruth:
    """Known attributes of real images standing in for concepts (the real-embedding path).

    ``concepts`` are 0/1 indicators of the held-out rows (e.g. "a square sits in slot r0c1",
    :func:`repdiag.binding.dataset.slot_attributes`). On the ``fit_rows`` half of the held-out
    rows each domain gets, per attribute ``a``, its *effect* ``t_i(a) = mean(x_i | a) -
    mean(x_i | not a)`` (difference of class means) and a linear *probe* ``w_i(a)`` (logistic
    regression on standardised inputs, folded back to input units); the other half
    (``eval_rows``) is where interventions are scored, projected on the target domain's probe:
    the change of its score ``w_j . delta`` against ``w_j . t_j(a)``, the score change the
    attribute makes on average. Attributes with fewer than ``MIN_CLASS_ROWS`` fit rows in either
    class are left out (``present`` False), and so is, in a domain, an attribute whose probe's
    balanced accuracy on the evaluation rows (``probe_accuracy``) is below ``MIN_PROBE_ACCURACY``:
    a domain that does not encode an attribute linearly has no effect of it to transfer. The
    selection reads each embedding alone, never a trained alignment model.
    """

    names: tuple[str, ...]
    concepts: np.ndarray  # (n_test, n_attributes) 0/1
    present: tuple[np.ndarray, np.ndarray]
    effects: tuple[np.ndarray, np.ndarray]  # (n_attributes, d_i), input units
    probes: tuple[np.ndarray, np.ndarray]  # (n_attributes, d_i), input units
    probe_accuracy: tuple[np.ndarray, np.ndarray]  # (n_attributes,)
    fit_rows: np.ndarray
    eval_rows: np.ndarray
    scales: tuple[float, float] = (1.0, 1.0)

    exact = False

    @property
    def shared(self) -> np.ndarray:
        return np.flatnonzero(self.present[0] & self.present[1])

    def rows(self, concept: int, max_rows: int) -> np.ndarray:
        """Evaluation rows that have attribute ``concept`` (the first ``max_rows``)."""
        return self.eval_rows[self.concepts[self.eval_rows, concept] > 0][:max_rows]

    def change(self, domain: int, rows: np.ndarray, concept: int) -> np.ndarray:
        """``t_i(a) / s_i`` on every row: the attribute's mean effect in the model's units."""
        effect = self.effects[domain][concept] / self.scales[domain]
        return np.broadcast_to(effect, (len(rows), effect.shape[0])).astype(np.float32)

    def readout(self, domain: int, concept: int) -> np.ndarray:
        """The probe ``w_i(a) s_i`` in the model's units (so ``w . x`` is unchanged)."""
        return (self.probes[domain][concept] * self.scales[domain]).astype(np.float64)


MIN_CLASS_ROWS = 5
MIN_PROBE_ACCURACY = 0.6


def probe_truth(
    test: Sequence[np.ndarray],
    indicators: np.ndarray,
    names: Sequence[str],
    *,
    fit_fraction: float = 0.5,
    seed: int = 0,
) -> ProbeTruth:
    """Effects and probes of every attribute on a random ``fit_fraction`` of the held-out rows."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    indicators = np.asarray(indicators, dtype=np.float32)
    order = np.random.default_rng([seed, 4]).permutation(len(indicators))
    n_fit = round(fit_fraction * len(order))
    fit_rows, eval_rows = np.sort(order[:n_fit]), np.sort(order[n_fit:])
    labels = indicators[fit_rows] > 0
    counts = np.minimum(labels.sum(0), (~labels).sum(0))
    usable = counts >= MIN_CLASS_ROWS
    effects, probes, accuracy = [], [], []
    for x in test:
        x = np.asarray(x, dtype=np.float64)
        mean, std = x[fit_rows].mean(0), x[fit_rows].std(0) + 1e-8
        d = x.shape[1]
        effect = np.zeros((len(names), d))
        probe = np.zeros((len(names), d))
        acc = np.full(len(names), np.nan)
        fit_x = x[fit_rows]
        fit_z, eval_z = (fit_x - mean) / std, (x[eval_rows] - mean) / std
        for a in np.flatnonzero(usable):
            fit_y = labels[:, a]
            effect[a] = fit_x[fit_y].mean(0) - fit_x[~fit_y].mean(0)
            model = LogisticRegression(C=1.0, max_iter=2000).fit(fit_z, fit_y)
            probe[a] = model.coef_[0] / std
            eval_y = indicators[eval_rows, a] > 0
            if eval_y.any() and not eval_y.all():
                acc[a] = balanced_accuracy_score(eval_y, model.predict(eval_z))
        effects.append(effect.astype(np.float32))
        probes.append(probe)
        accuracy.append(acc)
    decodable = [usable & (np.nan_to_num(acc) >= MIN_PROBE_ACCURACY) for acc in accuracy]
    return ProbeTruth(
        names=tuple(names),
        concepts=indicators,
        present=(decodable[0], decodable[1]),
        effects=(effects[0], effects[1]),
        probes=(probes[0], probes[1]),
        probe_accuracy=(accuracy[0], accuracy[1]),
        fit_rows=fit_rows,
        eval_rows=eval_rows,
    )


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
    truth: ConceptTruth | ProbeTruth | None = None
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
    correlation: float = 0.0,
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


def synthetic_pairs(
    *,
    n_concepts: int,
    k_active: int,
    dims: Sequence[int],
    maps: Sequence[str],
    nonlinearity: float,
    noise: float,
    n_train: int,
    n_test: int,
    paired_fraction: float,
    seed: int,
    frequency_exponent: float = 0.0,
    correlation: float = 0.0,
    n_specific: int = 0,
) -> PairedData:
    """Synthetic two-domain data with known concepts (see the module docstring for the model).

    Everything but the pairing depends only on ``seed``: the concept maps, the concepts of domain
    a and of the test split, and every noise draw (train and test noise have their own
    generators, scaled by an RMS that does not depend on the pairing). The paired fraction only
    decides which rows of domain b reuse domain a's concepts, so cells that differ only in the
    fraction see the same spaces and the same test split.
    """
    if len(dims) != 2 or len(maps) != 2:
        raise ConfigError("alignment.synthetic.dims and .maps must each list two domains")
    if n_specific < 0:
        raise ConfigError(f"alignment.synthetic.n_specific must be >= 0, got {n_specific}")
    n_total = n_concepts + 2 * n_specific
    rng = np.random.default_rng([seed, 0])
    domain_maps = [
        random_map(d, n_total, kind, nonlinearity, rng) for d, kind in zip(dims, maps, strict=True)
    ]
    present = []
    for i, domain_map in enumerate(domain_maps):
        mask = np.ones(n_total, dtype=bool)
        other = slice(n_concepts + (1 - i) * n_specific, n_concepts + (2 - i) * n_specific)
        mask[other] = False
        domain_map.dictionary[:, ~mask] = 0.0  # the other domain's private concepts are invisible
        present.append(mask)
    frequencies = (
        concept_frequencies(n_total, frequency_exponent, rng) if frequency_exponent > 0 else None
    )
    draw = dict(frequencies=frequencies, correlation=correlation)
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
        domains=tuple(maps),  # type: ignore[arg-type]
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
            "frequency_exponent": frequency_exponent,
            "correlation": correlation,
        },
    )


def dominant_concept(z: np.ndarray) -> np.ndarray:
    """Probe task of the synthetic data: the index of each sample's largest concept."""
    return np.argmax(z, axis=1).astype(np.int64)


def read_layer(
    path: str | Path, layer: str, image_sets: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Image ids and ``emb_<layer>`` rows of one embedding store, optionally only some image sets."""
    # imported here: the Snakefile's config check imports this module, and zarr costs 0.6 s
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


def _standardise(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(0)) / (x.std(0) + 1e-8)


def embedding_pairs(
    path_a: str | Path,
    path_b: str | Path,
    *,
    layer: str,
    paired_fraction: float,
    test_fraction: float,
    seed: int,
    image_sets: Sequence[str] | None = None,
    max_images: int | None = None,
    n_clusters: int = 8,
    attributes: tuple[np.ndarray, Sequence[str], np.ndarray] | None = None,
    attribute_fit_fraction: float = 0.5,
    reuse_truth: ProbeTruth | None = None,
    rotate_b: bool = False,
    shuffle_b: bool = False,
) -> PairedData:
    """Two encoders' embeddings of the same images, paired by image id (see module docstring).

    Probe labels of the held-out pairs are k-means clusters of both domains' standardised
    embeddings concatenated, so neither domain defines the task alone. ``attributes``
    ``(ids, names, indicators)`` (:func:`repdiag.binding.dataset.slot_attributes`) restricts
    the images to those with known attributes and gives the held-out pairs a
    :class:`ProbeTruth` (``truth``), which the intervention metrics read. The held-out split
    depends only on ``seed``, ``test_fraction`` and ``max_images``, so a caller looping over
    paired fractions can pass the first call's truth as ``reuse_truth`` instead of refitting.
    ``rotate_b`` expresses domain b in a Haar-random orthonormal basis (drawn from ``seed``):
    with ``path_b = path_a`` the pair has an exact linear alignment, the positive control.
    ``shuffle_b`` permutes domain b's training rows (seeded), so that its anchor pairs are wrong
    while the held-out pairs and their attributes stay right: with ``rotate_b`` and
    ``path_b = path_a``, the negative control (an alignment exists but nothing can learn it).
    """
    ids_a, x_a = read_layer(path_a, layer, image_sets)
    ids_b, x_b = read_layer(path_b, layer, image_sets)
    if rotate_b:
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
    rng = np.random.default_rng([seed, 2])
    order = rng.permutation(len(common))
    if max_images:
        order = order[:max_images]
    n_test = max(8, round(test_fraction * len(order)))
    test_rows, train_rows = order[:n_test], order[n_test:]
    n_paired = n_paired_rows(paired_fraction, len(train_rows))
    unpaired = train_rows[n_paired:]
    half = len(unpaired) // 2
    rows_train_a = np.concatenate([train_rows[:n_paired], unpaired[:half]])
    rows_train_b = np.concatenate([train_rows[:n_paired], unpaired[half:]])
    if shuffle_b:
        rows_train_b = np.random.default_rng([seed, 5]).permutation(rows_train_b)
    test = (x_a[rows_a[test_rows]], x_b[rows_b[test_rows]])
    labels = kmeans_labels(
        np.concatenate([_standardise(t) for t in test], axis=1), n_clusters, seed
    )
    truth = reuse_truth
    if attributes is not None and truth is None:
        attribute_ids, names, indicators = attributes
        lookup = {
            str(image): row for row, image in enumerate(np.asarray(attribute_ids).astype(str))
        }
        test_indicators = np.asarray(indicators)[[lookup[str(i)] for i in common[test_rows]]]
        truth = probe_truth(
            test, test_indicators, names, fit_fraction=attribute_fit_fraction, seed=seed
        )
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
            "n_without_attributes": n_without_attributes,
            "attributes": _attribute_info(truth),
            "layer": layer,
            "paired_fraction": paired_fraction,
            "n_common_images": len(common),
            "n_used": len(order),
            "n_test": len(test_rows),
            "test_ids_head": common[test_rows[:5]].tolist(),
        },
    )


def _attribute_info(truth: ProbeTruth | None) -> dict | None:
    """Per attribute: whether it is scored, and each domain's probe balanced accuracy."""
    if truth is None:
        return None
    return {
        name: {
            "scored": bool(truth.present[0][a] and truth.present[1][a]),
            "probe_accuracy": [
                None if np.isnan(acc[a]) else round(float(acc[a]), 4)
                for acc in truth.probe_accuracy
            ],
        }
        for a, name in enumerate(truth.names)
    }
