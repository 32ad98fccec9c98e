"""InterVenchA-style alignment metrics (the CoSAE paper, ``../shared/seeds/004``).

All metrics are computed on held-out pairs ``(x_a, x_b)`` in the normalised input space (unit
mean squared norm per domain), with codes ``c_i = E_i(x_i)`` and decoders ``D_i``.

M_extract (per domain, quality of one SAE)
    explained variance ``EV = 1 - sum ||x - D E x||^2 / sum ||x - mean(x)||^2``; ``L0`` the mean
    number of nonzero latents per sample; dead latents, those never active on the held-out set;
    on synthetic data ``MCC``, the mean absolute Pearson correlation between latents and
    ground-truth concepts after a Hungarian matching (maximum total |corr|).
M_tr (translation, representations aligned)
    ``R^2 = 1 - sum ||D_j E_i x_i - x_j||^2 / sum ||x_j - mean(x_j)||^2`` and the mean cosine of
    ``D_j E_i x_i`` with ``x_j``, for both directions.
M_cont (concept consistency, codes aligned)
    active-set agreement, the mean Jaccard index ``|S_a ∩ S_b| / |S_a ∪ S_b|`` of the supports
    of ``c_a`` and ``c_b`` (1 when both are empty); code correlation, the mean of the Pearson
    correlation ``rho_l`` of ``c_a[:, l]`` and ``c_b[:, l]`` (0 when one is constant) over the
    latents used in either domain, weighted by firing frequency,
    ``sum_l w_l rho_l / sum_l w_l`` with ``w_l = (P(c_a,l > 0) + P(c_b,l > 0)) / 2``
    (``code_correlation``; the unweighted mean is ``code_correlation_unweighted``); probe
    transfer, the accuracy on domain j's codes of a linear probe (standardise + one-vs-rest
    ridge classifier, closed form) trained on domain i's codes of other pairs.
Intervention metrics (the primary M_tr and M_cont)
    :mod:`repdiag.alignment.interventions`: on synthetic data against the known concepts, on
    real embeddings against the images' known attributes, whose effects and probes are fitted on
    the training images (:class:`repdiag.alignment.real_pairs.ProbeTruth`).
    ``attribute_probe_accuracy`` is the attribute probes' mean balanced accuracy on the held-out
    rows (reported, not used to select); ``effect_stability`` the median split-half cosine of
    the scored attributes' mean effects. MCC is not defined on real embeddings.
Cycle consistency
    ``R^2`` of ``x_i -> j -> i = D_i E_j D_j E_i x_i`` against ``x_i``; needs no pairs, which is why
    it is used as a proxy, and why the study checks whether it tracks M_tr.
Distributional distances
    sliced Wasserstein (:func:`repdiag.alignment.distances.sliced_wasserstein`) between translated and
    target samples, between the two code distributions, and, as a sampling floor, between two
    halves of the target's held-out samples. Its scale is ``sw_scale``, the total variance
    ``sum ||x_j - mean(x_j)||^2 / n`` of the target: the expected distance of the trivial
    translation that outputs the target's mean.
Intervals
    With ``bootstrap_counts`` (resamples of the held-out rows), :func:`evaluate_alignment` also
    returns each row-additive metric's draws (:mod:`repdiag.alignment.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from repdiag.alignment.interventions import DIRECTIONS, correlation_matrix, intervention_metrics
from repdiag.core.settings import FromConfig


def r2_score(target: np.ndarray, prediction: np.ndarray) -> float:
    """``1 - sum ||target - prediction||^2 / sum ||target - mean(target)||^2`` (variance-weighted)."""
    target = np.asarray(target, dtype=np.float64)
    prediction = np.asarray(prediction, dtype=np.float64)
    residual = np.sum((target - prediction) ** 2)
    total = np.sum((target - target.mean(0)) ** 2)
    return float(1.0 - residual / total) if total > 0 else float("nan")


def explained_variance(x: np.ndarray, reconstruction: np.ndarray) -> float:
    """Fraction of the variance of ``x`` explained by the reconstruction (``r2_score``)."""
    return r2_score(x, reconstruction)


def total_variance(x: np.ndarray) -> float:
    """``sum_n ||x_n - mean(x)||^2 / n``, the trace of the covariance (ddof = 0)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.sum((x - x.mean(0)) ** 2) / len(x))


def mean_cosine(prediction: np.ndarray, target: np.ndarray, eps: float = 1e-12) -> float:
    """Mean over rows of ``<p, t> / (||p|| ||t||)`` (rows with a zero vector count as 0)."""
    prediction = np.asarray(prediction, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    norms = np.linalg.norm(prediction, axis=1) * np.linalg.norm(target, axis=1)
    dots = np.sum(prediction * target, axis=1)
    return float(np.mean(np.where(norms > eps, dots / np.maximum(norms, eps), 0.0)))


def l0(codes: np.ndarray) -> float:
    """Mean number of nonzero latents per row."""
    return float(np.mean(np.count_nonzero(codes, axis=1)))


def dead_latents(codes: np.ndarray) -> int:
    """Number of latents (columns) that are zero on every row."""
    return int(np.sum(~np.any(codes != 0, axis=0)))


def mcc(codes: np.ndarray, concepts: np.ndarray) -> float:
    """Mean correlation coefficient: mean matched |corr| of latents and ground-truth concepts.

    Hungarian matching on ``|corr(codes, concepts)|`` (a latent matches at most one concept);
    the mean is over the ``min(n_latents, n_concepts)`` matched pairs.
    """
    corr = np.abs(correlation_matrix(codes, concepts))
    rows, cols = linear_sum_assignment(corr, maximize=True)
    return float(corr[rows, cols].mean())


def active_jaccard(codes_a: np.ndarray, codes_b: np.ndarray) -> float:
    """Mean over rows of ``|S_a ∩ S_b| / |S_a ∪ S_b|`` with ``S`` the nonzero latents (1 if both empty)."""
    active_a, active_b = codes_a != 0, codes_b != 0
    intersection = np.sum(active_a & active_b, axis=1)
    union = np.sum(active_a | active_b, axis=1)
    return float(np.mean(np.where(union > 0, intersection / np.maximum(union, 1), 1.0)))


def code_correlation(codes_a: np.ndarray, codes_b: np.ndarray, *, weighted: bool = True) -> float:
    """Mean of ``corr(c_a[:, l], c_b[:, l])`` over latents used in either domain (0 if constant).

    ``weighted`` (the default) weights latent ``l`` by its firing frequency averaged over the two
    domains, ``(P(c_a,l != 0) + P(c_b,l != 0)) / 2``, so that latents firing on a handful of rows
    do not dominate; ``weighted=False`` is the plain mean over used latents.
    """
    corr = np.diag(correlation_matrix(codes_a, codes_b))
    frequency = (np.mean(codes_a != 0, axis=0) + np.mean(codes_b != 0, axis=0)) / 2
    used = frequency > 0
    if not used.any():
        return 0.0
    if not weighted:
        return float(corr[used].mean())
    return float(np.sum(frequency * corr) / np.sum(frequency))


def probe_transfer(
    source_codes: np.ndarray,
    target_codes: np.ndarray,
    labels: np.ndarray,
    *,
    train_fraction: float,
    seed: int,
) -> dict[str, float]:
    """Train a linear probe on the source codes of some pairs; test it on the others' codes.

    Returns ``source`` (accuracy on held-out source codes), ``transfer`` (the same probe on the
    target codes of those held-out pairs) and ``chance`` (majority-class rate of the test rows).
    """
    from sklearn.linear_model import RidgeClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    labels = np.asarray(labels)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_train = round(train_fraction * len(labels))
    train, test = order[:n_train], order[n_train:]
    chance = float(np.max(np.bincount(labels[test])) / len(test))
    if len(np.unique(labels[train])) < 2:
        return {"source": chance, "transfer": chance, "chance": chance}
    probe = make_pipeline(StandardScaler(), RidgeClassifier(alpha=1.0))
    probe.fit(source_codes[train], labels[train])
    return {
        "source": float(probe.score(source_codes[test], labels[test])),
        "transfer": float(probe.score(target_codes[test], labels[test])),
        "chance": chance,
    }


def sliced_wasserstein_np(x: np.ndarray, y: np.ndarray, n_projections: int, seed: int) -> float:
    """:func:`repdiag.alignment.distances.sliced_wasserstein` on arrays, with seeded directions."""
    import torch

    from repdiag.alignment.distances import sliced_wasserstein

    generator = torch.Generator().manual_seed(seed)
    value = sliced_wasserstein(
        torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float64),
        torch.as_tensor(np.ascontiguousarray(y), dtype=torch.float64),
        n_projections,
        generator,
    )
    return float(value)


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(kept)) if kept else None


def _attribute_accuracy(truth) -> float | None:
    """Mean balanced accuracy of a real path's attribute probes over domains and attributes."""
    accuracy = getattr(truth, "probe_accuracy", None)
    if accuracy is None:
        return None
    values = np.concatenate(list(accuracy))
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def _forward(model, test: Sequence[np.ndarray]) -> dict:
    """Inputs, codes, reconstructions, translations and cycles of the held-out pairs."""
    import torch

    with torch.no_grad():
        xs = [torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in test]
        codes = [model.encode(i, x) for i, x in enumerate(xs)]
        return {
            "x": [x.numpy() for x in xs],
            "codes": [c.numpy() for c in codes],
            "reconstruction": [model.decode(i, c).numpy() for i, c in enumerate(codes)],
            "translated": {(i, j): model.decode(j, codes[i]).numpy() for i, j in DIRECTIONS},
            "cycled": {(i, j): model.cycle(i, j, xs[i]).numpy() for i, j in DIRECTIONS},
        }


def _extract(arrays: dict, concepts: np.ndarray | None, truth) -> dict:
    """M_extract per domain: explained variance, L0, dead latents, MCC (with known concepts)."""
    extract = {}
    n_latents = arrays["codes"][0].shape[1]
    for i, name in enumerate(NAMES):
        x, codes = arrays["x"][i], arrays["codes"][i]
        seen = concepts
        if truth is not None and concepts is not None:
            seen = concepts[:, truth.present[i]]
        extract[name] = {
            "explained_variance": explained_variance(x, arrays["reconstruction"][i]),
            "l0": l0(codes),
            "dead_latents": dead_latents(codes),
            "dead_fraction": dead_latents(codes) / n_latents,
            "mcc": mcc(codes, seen) if seen is not None else None,
        }
    return extract


def _distributional(x: list, codes: list, translated: dict, projections: int, seed: int) -> dict:
    arrow = {d: f"{NAMES[d[0]]}->{NAMES[d[1]]}" for d in DIRECTIONS}
    half = len(x[0]) // 2
    return {
        "sw_translation": {
            arrow[(i, j)]: sliced_wasserstein_np(translated[(i, j)], x[j], projections, seed)
            for i, j in DIRECTIONS
        },
        "sw_codes": sliced_wasserstein_np(codes[0], codes[1], projections, seed),
        "sw_floor": {
            name: sliced_wasserstein_np(x[i][:half], x[i][half:], projections, seed)
            for i, name in enumerate(NAMES)
        },
        "sw_scale": {name: total_variance(x[i]) for i, name in enumerate(NAMES)},
    }


NAMES = ("a", "b")
INTERVENTION_KEYS = (
    "tr_intervention_input",
    "tr_latent_ablation",
    "tr_intervention_decoded",
    "tr_intervention_probe",
)
STABILITY_KEYS = ("effect_stability", "effect_stability_min", "n_attributes_scored")


def _summary(result: dict, truth) -> dict:
    """The flat columns: values averaged over domains or directions."""
    extract, intervention = result["extract"], result["intervention"] or {}
    probes, distributional = result["consistency"]["probe"], result["distributional"]
    stability = dict.fromkeys(STABILITY_KEYS)
    if truth is not None and not truth.exact:
        from repdiag.alignment.real_pairs import effect_stability

        stability = effect_stability(truth)
    return {
        **{k: intervention.get(k) for k in ("tr_intervention", "cont_intervention")},
        "concept_match": intervention.get("concept_match"),
        **{k: _mean([extract[n][k] for n in NAMES]) for k in ("explained_variance", "l0")},
        "dead_fraction": _mean([extract[n]["dead_fraction"] for n in NAMES]),
        "mcc": _mean([extract[n]["mcc"] for n in NAMES]),
        "tr_r2": _mean([v["r2"] for v in result["translation"].values()]),
        "tr_cosine": _mean([v["cosine"] for v in result["translation"].values()]),
        **{
            k: result["consistency"][k]
            for k in ("jaccard", "code_correlation", "code_correlation_unweighted")
        },
        **{k: intervention.get(k) for k in INTERVENTION_KEYS},
        "attribute_probe_accuracy": _attribute_accuracy(truth),
        **stability,
        **{
            f"probe_{k}": _mean([v[k] for v in probes.values()])
            for k in ("source", "transfer", "chance")
        },
        "cycle_r2": _mean(list(result["cycle"].values())),
        "sw_translation": _mean(list(distributional["sw_translation"].values())),
        "sw_codes": distributional["sw_codes"],
        "sw_floor": _mean(list(distributional["sw_floor"].values())),
        "sw_scale": _mean(list(distributional["sw_scale"].values())),
    }


@dataclass(frozen=True)
class EvaluationSettings(FromConfig):
    """``alignment.evaluation``: the held-out metrics' own settings."""

    SECTION = "alignment.evaluation"

    sw_projections: int  # directions of the sliced-Wasserstein metrics
    probe_train_fraction: float  # held-out pairs that fit the linear probe; the rest test it


def evaluate_alignment(
    model,
    test: Sequence[np.ndarray],
    *,
    labels: np.ndarray,
    settings: EvaluationSettings,
    seed: int,
    concepts: np.ndarray | None = None,
    truth=None,
    bootstrap_counts: np.ndarray | None = None,
) -> dict:
    """Every metric of the study for a trained :class:`repdiag.alignment.methods.PairModel`.

    ``test`` holds the held-out pairs (normalised), ``labels`` the probe task, ``concepts`` the
    ground truth when known, ``truth`` (:class:`repdiag.alignment.concepts.ConceptTruth` or
    :class:`repdiag.alignment.real_pairs.ProbeTruth`) what the intervention metrics need;
    without it they are None. Returns the per-domain/per-direction details and a ``summary`` of
    flat values averaged over domains or directions (the columns). With ``bootstrap_counts``
    (``(n_boot, n_rows)`` resample counts of the held-out rows) it adds ``bootstrap_draws``,
    ``{metric: (n_boot,) values}`` (numpy: not for a JSON record).
    """
    arrays = _forward(model, test)
    x, codes, translated = arrays["x"], arrays["codes"], arrays["translated"]
    if truth is not None and concepts is None and truth.exact:
        concepts = truth.concepts
    arrow = {d: f"{NAMES[d[0]]}->{NAMES[d[1]]}" for d in DIRECTIONS}
    translation = {
        arrow[(i, j)]: {
            "r2": r2_score(x[j], translated[(i, j)]),
            "cosine": mean_cosine(translated[(i, j)], x[j]),
        }
        for i, j in DIRECTIONS
    }
    probes = {
        arrow[(i, j)]: probe_transfer(
            codes[i], codes[j], labels, train_fraction=settings.probe_train_fraction, seed=seed
        )
        for i, j in DIRECTIONS
    }
    intervention = intervention_metrics(model, x, truth) if truth is not None else None
    row_parts = intervention.pop("row_parts") if intervention is not None else None
    result = {
        "extract": _extract(arrays, concepts, truth),
        "translation": translation,
        "cycle": {
            f"{arrow[(i, j)]}->{NAMES[i]}": r2_score(x[i], arrays["cycled"][(i, j)])
            for i, j in DIRECTIONS
        },
        "consistency": {
            "jaccard": active_jaccard(codes[0], codes[1]),
            "code_correlation": code_correlation(codes[0], codes[1]),
            "code_correlation_unweighted": code_correlation(codes[0], codes[1], weighted=False),
            "probe": probes,
        },
        "distributional": _distributional(x, codes, translated, settings.sw_projections, seed),
        "intervention": intervention,
    }
    result["summary"] = _summary(result, truth)
    if bootstrap_counts is not None:
        from repdiag.alignment.bootstrap import metric_draws

        result["bootstrap_draws"] = metric_draws(bootstrap_counts, row_parts=row_parts, **arrays)
    return result
