"""Binding accuracy of frozen embeddings under three readouts: cosine, kNN and local PCA.

The binding task (the binding paper, "Global geometry is not enough for vision representations"):
each query image has ``n_candidates`` target images, exactly one with the query's shape-to-slot
arrangement. A readout scores every (query, candidate) pair; a query is a hit when its correct
candidate scores strictly highest (a tie with any other candidate is a miss, so a readout that
cannot tell the candidates apart scores 0, never chance by luck of tie-breaking).

Readouts, all ``(query (n_q, d), candidates (n_q, n_c, d), reference (n_r, d) | None, **options)
-> scores (n_q, n_c)``, registered in :data:`READOUTS`:

- ``cosine``: ``<q, c> / (|q| |c|)``, the paper's main readout; no reference set.
- ``knn``: shared-nearest-neighbour similarity in a reference set. Each embedding ``x`` becomes a
  vector over the reference set, ``a_r(x) = w(x, r)`` for its ``k`` nearest reference embeddings
  ``r`` (cosine similarity) and 0 elsewhere; the score is the cosine of ``a(q)`` and ``a(c)``.
  ``weights="binary"`` (``w = 1``) gives the shared-neighbour overlap ``|N_k(q) ∩ N_k(c)| / k``;
  ``weights="similarity"`` (default, ``w = (1 + cos(x, r)) / 2``) weighs each shared neighbour
  by how close both points are to it, which makes ties rare.
- ``local_pca``: compare query and candidate inside the principal subspace of the query's local
  neighbourhood: take the ``k`` nearest reference embeddings of ``q`` (cosine), their mean ``m``
  and top-``dim`` principal directions ``U`` (d, dim); the score is
  ``cos(U^T (q - m), U^T (c - m))``.

``knn`` and ``local_pca`` work on unit-normalised embeddings (the sphere on which cosine lives).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.special import ndtri

from repdiag.metrics.geometry import knn_indices
from repdiag.registry import Registry

Readout = Callable[..., np.ndarray]
READOUTS: Registry[Readout] = Registry("readout")

CI_METHOD = "wilson"
# Query blocks are sized so that a (rows, n_reference) float64 block stays about this big.
CHUNK_VALUES = 4_000_000
EPS = 1e-12


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm; zero rows stay zero (their cosine with anything is 0)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), EPS)


def _need_reference(name: str, reference: np.ndarray | None, k: int, d: int) -> np.ndarray:
    """The reference set as float64 (n, d), checked against ``k`` and the query width ``d``."""
    if reference is None:
        raise ValueError(f"readout {name!r} needs a reference set of embeddings (reference=...)")
    reference = np.asarray(reference, dtype=np.float64)
    if reference.ndim != 2 or reference.shape[1] != d:
        raise ValueError(
            f"readout {name!r}: reference must be (n, {d}) like the queries, got {reference.shape}"
        )
    if not np.all(np.isfinite(reference)):
        raise ValueError(f"readout {name!r}: reference holds NaN or infinite values")
    if not 1 <= k <= reference.shape[0]:
        raise ValueError(
            f"readout {name!r}: k={k} neighbours need a reference set of at least k embeddings, "
            f"got {reference.shape[0]}"
        )
    return reference


def _blocks(n_queries: int, rows_per_query: int, width: int) -> tuple[range, int]:
    """Start indices and size of query blocks that keep temporary arrays near CHUNK_VALUES."""
    step = max(1, CHUNK_VALUES // max(rows_per_query * width, 1))
    return range(0, n_queries, step), step


@READOUTS.register("cosine")
def cosine_scores(
    query: np.ndarray, candidates: np.ndarray, reference: np.ndarray | None = None
) -> np.ndarray:
    """score(q, c) = <q, c> / (|q| |c|); ``reference`` is ignored."""
    return np.einsum("qd,qcd->qc", _unit(query), _unit(candidates))


@READOUTS.register("knn")
def knn_scores(
    query: np.ndarray,
    candidates: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    k: int = 10,
    weights: str = "similarity",
) -> np.ndarray:
    """score(q, c) = cos(a(q), a(c)), ``a_r(x) = w(x, r) 1[r in N_k(x)]`` over the reference set.

    ``N_k(x)``: the ``k`` reference embeddings most cosine-similar to ``x``. ``weights="binary"``:
    ``w = 1`` (score = shared-neighbour fraction |N_k(q) ∩ N_k(c)| / k, Jarvis & Patrick 1973);
    ``weights="similarity"``: ``w = (1 + cos(x, r)) / 2``.
    """
    if weights not in ("binary", "similarity"):
        raise ValueError(
            f"readout 'knn': weights must be 'binary' or 'similarity', got {weights!r}"
        )
    n_q, n_c, d = candidates.shape
    reference = _unit(_need_reference("knn", reference, k, d))
    points = _unit(np.concatenate([query[:, None, :], candidates], axis=1))  # (n_q, 1 + n_c, d)
    scores = np.empty((n_q, n_c))
    starts, step = _blocks(n_q, 1 + n_c, reference.shape[0])
    for start in starts:
        block = points[start : start + step].reshape(-1, d)
        nbrs = knn_indices(block, reference, k, metric="cosine")
        if weights == "binary":
            values = np.ones(nbrs.shape)
        else:
            sims = np.einsum("md,mkd->mk", block, reference[nbrs])
            values = (1.0 + sims) / 2.0
        affinity = np.zeros((block.shape[0], reference.shape[0]))
        np.put_along_axis(affinity, nbrs, values, axis=1)
        affinity = _unit(affinity).reshape(-1, 1 + n_c, reference.shape[0])
        scores[start : start + step] = np.einsum("br,bcr->bc", affinity[:, 0], affinity[:, 1:])
    return scores


@READOUTS.register("local_pca")
def local_pca_scores(
    query: np.ndarray,
    candidates: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    k: int = 20,
    dim: int = 5,
) -> np.ndarray:
    """score(q, c) = cos(U^T (q - m), U^T (c - m)) in the query's local principal subspace.

    ``m`` and ``U`` (d, dim): mean and top-``dim`` principal directions (SVD of the centred
    neighbourhood) of the ``k`` reference embeddings most cosine-similar to ``q``; all on unit
    vectors. A centred set of ``k`` points spans at most ``k - 1`` directions, so ``dim < k``.
    """
    n_q, n_c, d = candidates.shape
    reference = _unit(_need_reference("local_pca", reference, k, d))
    if not 1 <= dim <= min(k - 1, d):
        raise ValueError(
            f"readout 'local_pca': dim={dim} must be between 1 and min(k - 1, d) = {min(k - 1, d)}"
        )
    query, candidates = _unit(query), _unit(candidates)
    nbrs = knn_indices(query, reference, k, metric="cosine")
    scores = np.empty((n_q, n_c))
    starts, step = _blocks(n_q, k + n_c, d)
    for start in starts:
        hood = reference[nbrs[start : start + step]]  # (b, k, d)
        centre = hood.mean(axis=1, keepdims=True)
        basis = np.linalg.svd(hood - centre, full_matrices=False)[2][:, :dim]  # (b, dim, d)
        z_query = np.einsum("bjd,bd->bj", basis, query[start : start + step] - centre[:, 0])
        z_cand = np.einsum("bjd,bcd->bcj", basis, candidates[start : start + step] - centre)
        scores[start : start + step] = np.einsum("bj,bcj->bc", _unit(z_query), _unit(z_cand))
    return scores


def readout_scores(
    query_features: np.ndarray,
    candidate_features: np.ndarray,
    readout: str = "cosine",
    reference: np.ndarray | None = None,
    **options: Any,
) -> np.ndarray:
    """Scores (n_queries, n_candidates) of the registered ``readout`` after validating shapes."""
    query, candidates = _check_features(query_features, candidate_features)
    return READOUTS.get(readout)(query, candidates, reference, **options)


def _check_features(query: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    query = np.asarray(query, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.float64)
    if query.ndim != 2 or candidates.ndim != 3 or candidates.shape[::2] != query.shape:
        raise ValueError(
            "query_features must be (n_queries, d) and candidate_features "
            f"(n_queries, n_candidates, d); got {query.shape} and {candidates.shape}"
        )
    for name, values in (("query_features", query), ("candidate_features", candidates)):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} holds NaN or infinite values")
    return query, candidates


def hits_from_scores(scores: np.ndarray, correct_index: np.ndarray) -> np.ndarray:
    """Boolean (n_queries,): the correct candidate's score is strictly above every other score.

    Ties are misses; NaN scores are misses.
    """
    scores = np.asarray(scores, dtype=np.float64)
    correct_index = np.asarray(correct_index)
    n_q, n_c = scores.shape
    if correct_index.shape != (n_q,) or correct_index.dtype.kind not in "iu":
        raise ValueError(f"correct_index must be ({n_q},) integers, got {correct_index.shape}")
    if np.any((correct_index < 0) | (correct_index >= n_c)):
        raise ValueError(f"correct_index values must lie in [0, {n_c}) (n_candidates = {n_c})")
    rows = np.arange(n_q)
    correct = scores[rows, correct_index]
    others = scores.copy()
    others[rows, correct_index] = -np.inf
    return correct > others.max(axis=1)


def wilson_interval(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927), no continuity correction.

    centre = (h + z^2/2) / (n + z^2), half-width = z / (n + z^2) * sqrt(h (n - h) / n + z^2 / 4);
    identical to ``scipy.stats.binomtest(h, n).proportion_ci(method="wilson")``.
    """
    if n <= 0 or not 0 <= hits <= n:
        raise ValueError(f"a binomial interval needs 0 <= hits <= n and n > 0, got {hits}/{n}")
    z = float(ndtri(0.5 + confidence / 2.0))
    centre = (hits + z * z / 2.0) / (n + z * z)
    half = z / (n + z * z) * np.sqrt(hits * (n - hits) / n + z * z / 4.0)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def binding_accuracy(
    query_features: np.ndarray,
    candidate_features: np.ndarray,
    correct_index: np.ndarray,
    readout: str = "cosine",
    reference: np.ndarray | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Binding accuracy of one readout with its Wilson 95% interval and the chance level.

    ``query_features`` (n_queries, d), ``candidate_features`` (n_queries, n_candidates, d),
    ``correct_index`` (n_queries,). A query is a hit when its correct candidate scores strictly
    highest (ties are misses). Returns ``accuracy``, ``ci_low``, ``ci_high`` (Wilson score
    interval, 95%), ``n``, ``hits``, ``chance = 1 / n_candidates``, ``ci_method``, ``readout``.
    """
    scores = readout_scores(query_features, candidate_features, readout, reference, **options)
    hits = hits_from_scores(scores, correct_index)
    n, n_hits = int(hits.size), int(hits.sum())
    low, high = wilson_interval(n_hits, n)
    return {
        "readout": readout,
        "accuracy": n_hits / n,
        "ci_low": low,
        "ci_high": high,
        "n": n,
        "hits": n_hits,
        "chance": 1.0 / scores.shape[1],
        "ci_method": CI_METHOD,
    }
