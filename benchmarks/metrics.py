"""Speed of the metrics stage against naive per-point baselines, in the same process.

    .venv/bin/python benchmarks/metrics.py [--n 512] [--d 768] [--queries 256]

Prints, for embeddings of paper-like width: L.Iso (k = 5, 10, 20, 50) batched on Gram matrices
vs one ``eigvalsh`` of the (d, d) neighbourhood covariance per point; G.PR / G.Iso via the smaller
of Gram and covariance vs the (d, d) covariance; local PCA readout batched vs a per-query loop;
and the time of one whole layer (geometry, three readouts, probe). Ratios > 1 mean we are faster.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from repdiag.binding.metrics import geometry as geo
from repdiag.binding.metrics import readouts as ro
from repdiag.binding.metrics.options import MetricsSettings
from repdiag.binding.metrics.probes import same_different_probe


def _time(fn: Callable[[], object], repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def naive_local_isotropy(x: np.ndarray, k: int) -> float:
    """Per point: neighbours by full sort, (d, d) covariance, eigvalsh."""
    scores = []
    for i in range(x.shape[0]):
        dist = ((x - x[i]) ** 2).sum(axis=1)
        dist[i] = np.inf
        hood = x[np.argsort(dist)[:k]]
        values = np.linalg.eigvalsh(np.cov(hood, rowvar=False))
        scores.append(1 - values[-1] / values.sum())
    return float(np.mean(scores))


def naive_local_pca(query, candidates, reference, k, dim) -> np.ndarray:
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    query, candidates, reference = unit(query), unit(candidates), unit(reference)
    scores = np.empty(candidates.shape[:2])
    for i in range(query.shape[0]):
        hood = reference[np.argsort(-(reference @ query[i]))[:k]]
        mean = hood.mean(axis=0)
        basis = np.linalg.eigh(np.cov(hood, rowvar=False))[1][:, ::-1][:, :dim]
        zq = basis.T @ (query[i] - mean)
        zc = (candidates[i] - mean) @ basis
        scores[i] = zc @ zq / (np.linalg.norm(zc, axis=1) * np.linalg.norm(zq))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="reference embeddings")
    parser.add_argument("--d", type=int, default=768, help="embedding width")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument(
        "--naive-points", type=int, default=16, help="points (queries) timed in the naive loops"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(args.n, args.d)) @ rng.normal(size=(args.d, args.d)) / np.sqrt(args.d)
    query = rng.normal(size=(args.queries, args.d))
    candidates = query[:, None] + rng.normal(size=(args.queries, 8, args.d))
    correct = rng.integers(0, 8, size=args.queries)
    pairs = rng.normal(size=(args.n // 2, 2, args.d))
    labels = np.tile([0, 1], args.n // 4)
    print(f"reference n={args.n}, d={args.d}, queries={args.queries} x 8 candidates")

    # Naive loops: timed on a subset of points (queries) and scaled linearly to all of them.
    sub = args.naive_points
    for k in (5, 10, 20, 50):
        ours = _time(lambda k=k: geo.local_isotropy(ref, k))
        naive = _time(lambda k=k: naive_local_isotropy(ref[: max(sub, k + 1)], k))
        naive *= args.n / max(sub, k + 1)
        print(
            f"L.Iso k={k:>2}: batched {ours:7.3f} s, naive (d x d per point) {naive:7.3f} s, ratio {naive / ours:6.1f}"
        )

    ours = _time(lambda: geo.covariance_spectrum(ref), 3)
    cov = _time(lambda: np.linalg.eigvalsh(np.cov(ref, rowvar=False)), 3)
    print(
        f"spectrum: min(Gram, cov) {ours:7.3f} s, (d x d) covariance {cov:7.3f} s, ratio {cov / ours:6.1f}"
    )

    ours = _time(lambda: ro.local_pca_scores(query, candidates, ref, k=20, dim=5))
    naive = _time(lambda: naive_local_pca(query[:sub], candidates[:sub], ref, 20, 5))
    naive *= args.queries / sub
    print(
        f"local_pca: batched {ours:7.3f} s, per-query loop {naive:7.3f} s, ratio {naive / ours:6.1f}"
    )

    settings = MetricsSettings.from_config({})  # the schema's defaults

    def one_layer() -> None:
        geo.geometry_metrics(ref, settings.geometry.l_iso_k)
        for name in settings.readouts.names:
            keywords = settings.readouts.keywords(name)
            ro.binding_accuracy(query, candidates, correct, name, ref, **keywords)
        same_different_probe(pairs, labels, settings.probe, 0)

    print(f"one layer, every metric: {_time(one_layer):7.3f} s")


if __name__ == "__main__":
    main()
