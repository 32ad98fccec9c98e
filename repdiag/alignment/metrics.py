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
Intervention metrics (synthetic data, ground truth known; the primary M_tr and M_cont)
    Both score a predicted change ``p`` against a true change ``t`` with the pooled agreement
    ``A = 1 - sum ||p - t||^2 / sum (||p||^2 + ||t||^2)`` over every intervention (row, concept,
    direction): 1 iff ``p = t`` everywhere, 0 when the changes are orthogonal or one is zero,
    -1 when opposite. For each concept ``c`` both domains see and each held-out row where ``c``
    is active, the true effect of ``c`` in domain i is ``t_i = g_i(W_i z) - g_i(W_i z_{-c})``
    (``z_{-c}``: ``c`` set to 0; scaled like the inputs), and the latent of ``c`` in domain i,
    ``l_i(c)``, is its partner in the Hungarian matching of domain i's latents to the concepts
    domain i sees (maximum total |corr| on the held-out codes, as for MCC).

    - ``tr_intervention`` (M_tr): ablate ``l_i(c)`` in ``c_i = E_i x_i`` and translate:
      ``p = D_j(c_i) - D_j(c_i with l_i(c) = 0)``, scored against ``t_j``; both directions.
      It is high only if the latent carrying ``c`` in domain i decodes to ``c``'s effect in
      domain j, whatever the latent indices of domain j.
    - ``tr_intervention_input``: the same with the intervention on the input instead of a
      latent, ``p = D_j E_i x_i - D_j E_i (x_i - t_i)`` (no latent identification needed).
    - ``cont_intervention`` (M_cont): remove ``c`` from the inputs of both domains and compare
      the code changes, ``p = E_a x_a - E_a (x_a - t_a)`` against ``E_b x_b - E_b (x_b - t_b)``:
      high only if the same concept moves the same latents by the same amount in both domains.
    - ``concept_match``: the fraction of shared concepts with ``l_a(c) = l_b(c)`` (after SAE-A's
      permutation for SAE-A), next to the per-domain MCC over the concepts that domain sees.
Intervention metrics on real embeddings (known attributes stand in for concepts)
    The concepts are the images' known attributes ("a square sits in slot r0c1"), split into a
    fit half and an evaluation half of the held-out pairs
    (:class:`repdiag.alignment.concepts.ProbeTruth`). On the fit half, each domain's effect of
    attribute ``a`` is the difference of class means ``t_i = mean(x_i | a) - mean(x_i | not a)``
    and its probe ``w_i`` a logistic regression; latents are matched to attributes there. On
    the evaluation rows that have ``a``, ``x_i - t_i`` is the counterfactual input.

    - ``tr_intervention`` (M_tr on real embeddings, the decoded input intervention): the
      translated change ``p = D_j E_i x_i - D_j E_i (x_i - t_i)`` against the target's own
      decoded change ``t = D_j E_j x_j - D_j E_j (x_j - t_j)``, row by row, both read out on
      ``u_j = t_j / ||t_j||^2`` (``p . u_j``: how much of the attribute's mean effect the change
      carries; a rotation of either domain rotates ``u_j`` along, so the score does not depend
      on the basis). 1: translating a's intervention changes b exactly as b's own dictionary
      does; 0: the translated change carries nothing of it (a translator fitted to broken pairs
      outputs b's mean, ``p = 0``). ``tr_intervention_probe`` reads both out on the probe
      ``w_j`` instead. Comparing decoded changes of both domains, the score is not capped by how
      faithfully one SAE reproduces the small change ``x - t``.
    - ``tr_latent_ablation`` (an extraction diagnostic, not M_tr): ablate the latent matched to
      ``a`` (on signed correlation) and translate, ``p = w_j . (D_j c_i - D_j c_i^{-l})``,
      against ``w_j . t_j``: high only if a single latent carries the whole attribute at a
      constant size, a property of one domain's dictionary rather than of translation.
    - ``tr_intervention_input``: ``p = w_j . (D_j E_i x_i - D_j E_i (x_i - t_i))`` against
      ``w_j . t_j`` (capped by the SAE's reproduction of ``x - t``).
    - ``cont_intervention`` compares the code changes ``E_i x_i - E_i (x_i - t_i)`` of the two
      domains as above.

    ``attribute_probe_accuracy`` is the probes' mean balanced
    accuracy on the evaluation rows over all attributes (0.5: not linearly decodable); only
    attributes decodable in both domains (balanced accuracy >= 0.6) are intervened on, and
    with none the intervention metrics are empty. MCC is not defined (the attributes are not
    the embeddings' generative factors). ``control: rotation`` (b = a in a random basis: an
    exact alignment exists) is each metric's ceiling on the embeddings, ``control: shuffle``
    (the same with b's training rows permuted: the anchor pairs are wrong) its floor.
Cycle consistency
    ``R^2`` of ``x_i -> j -> i = D_i E_j D_j E_i x_i`` against ``x_i``; needs no pairs, which is why
    it is used as a proxy, and why the study checks whether it tracks M_tr.
Distributional distances
    sliced Wasserstein (:func:`repdiag.alignment.distances.sliced_wasserstein`) between translated and
    target samples, between the two code distributions, and, as a sampling floor, between two
    halves of the target's held-out samples. Its scale is ``sw_scale``, the total variance
    ``sum ||x_j - mean(x_j)||^2 / n`` of the target: the expected distance of the trivial
    translation that outputs the target's mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment


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


def correlation_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlations between each column of ``a`` and each column of ``b`` (0 if constant)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a - a.mean(0)
    b = b - b.mean(0)
    norms = np.outer(np.linalg.norm(a, axis=0), np.linalg.norm(b, axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = (a.T @ b) / norms
    return np.where(norms > 0, corr, 0.0)


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


def change_agreement(prediction: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """The two sums of ``A = 1 - sum ||p - t||^2 / sum (||p||^2 + ||t||^2)`` (error, total).

    Returned unreduced so that several interventions can be pooled; see :func:`pooled_agreement`.
    """
    p = np.asarray(prediction, dtype=np.float64)
    t = np.asarray(truth, dtype=np.float64)
    return float(np.sum((p - t) ** 2)), float(np.sum(p**2) + np.sum(t**2))


def pooled_agreement(parts: Sequence[tuple[float, float]]) -> float | None:
    """``1 - sum error / sum total`` over :func:`change_agreement` parts (None without any)."""
    error = sum(e for e, _ in parts)
    total = sum(t for _, t in parts)
    return float(1.0 - error / total) if total > 0 else None


def concept_latents(
    codes: np.ndarray, concepts: np.ndarray, present: np.ndarray, *, signed: bool = False
) -> dict[int, int]:
    """Concept -> latent of the Hungarian matching on ``|corr|`` (concepts the domain sees), or
    on ``corr`` itself when ``signed``: a latent that fires when the concept is absent is then
    never its partner (ablating it would remove the opposite of the concept)."""
    seen = np.flatnonzero(present)
    corr = correlation_matrix(codes, concepts[:, seen])
    rows, cols = linear_sum_assignment(corr if signed else np.abs(corr), maximize=True)
    return {int(seen[c]): int(r) for r, c in zip(rows, cols, strict=True)}


def effect_readout(effect: np.ndarray) -> np.ndarray:
    """``u = t / ||t||^2`` for a mean effect ``t``: ``u . t = 1``, and rotating a domain rotates
    ``t`` and ``u`` together, so ``u . delta`` does not depend on the domain's basis."""
    effect = np.asarray(effect, dtype=np.float64)
    norm = float(effect @ effect)
    return effect / norm if norm > 0 else effect


def intervention_metrics(model, test: Sequence[np.ndarray], truth, *, max_rows: int = 256) -> dict:
    """The intervention metrics (module docstring): ``tr_intervention``, its parts
    ``tr_latent_ablation``, ``tr_intervention_decoded`` and ``tr_intervention_probe``,
    ``tr_intervention_input``, ``cont_intervention`` and ``concept_match``.

    ``truth`` is a :class:`repdiag.alignment.concepts.ConceptTruth` (synthetic, ``exact``) or
    :class:`~repdiag.alignment.concepts.ProbeTruth` (real embeddings) whose scales are those of
    ``test``; at most ``max_rows`` held-out rows per concept (``truth.rows``). Latents are
    matched to concepts on ``truth.fit_rows`` (on signed correlation for real embeddings).
    M_tr (``tr_intervention``) is the latent ablation on synthetic data and the decoded input
    intervention on real embeddings.
    """
    import torch

    xs = [np.asarray(x, dtype=np.float32) for x in test]
    with torch.no_grad():
        codes = [model.encode(i, torch.as_tensor(x)).numpy() for i, x in enumerate(xs)]
    fit = truth.fit_rows
    latents = [
        concept_latents(
            codes[i][fit], truth.concepts[fit], truth.present[i], signed=not truth.exact
        )
        for i in range(2)
    ]
    shared = truth.shared
    parts: dict[str, list] = {key: [] for key in ("latent", "input", "decoded", "probe", "cont")}
    per_concept = []
    for c in shared:
        rows = truth.rows(int(c), max_rows)
        if len(rows) == 0:
            continue
        true = [truth.change(i, rows, int(c)) for i in range(2)]
        with torch.no_grad():
            factual = [torch.as_tensor(xs[i][rows]) for i in range(2)]
            counterfactual = [torch.as_tensor(xs[i][rows] - true[i]) for i in range(2)]
            code = [model.encode(i, factual[i]) for i in range(2)]
            code_cf = [model.encode(i, counterfactual[i]) for i in range(2)]
            for i, j in DIRECTIONS:
                ablated = code[i].clone()
                if int(c) in latents[i]:
                    ablated[:, latents[i][int(c)]] = 0.0
                latent_change = (model.decode(j, code[i]) - model.decode(j, ablated)).numpy()
                input_change = (model.decode(j, code[i]) - model.decode(j, code_cf[i])).numpy()
                # the target's own decoded change: what j's dictionary makes of the intervention
                own_change = (model.decode(j, code[j]) - model.decode(j, code_cf[j])).numpy()
                readout = truth.readout(j, int(c))
                if readout is None:  # synthetic: whole vectors
                    parts["latent"].append(change_agreement(latent_change, true[j]))
                    parts["input"].append(change_agreement(input_change, true[j]))
                    parts["decoded"].append(change_agreement(input_change, own_change))
                    continue
                target = true[j] @ readout
                parts["latent"].append(change_agreement(latent_change @ readout, target))
                parts["input"].append(change_agreement(input_change @ readout, target))
                along = effect_readout(true[j][0])
                parts["decoded"].append(change_agreement(input_change @ along, own_change @ along))
                parts["probe"].append(
                    change_agreement(input_change @ readout, own_change @ readout)
                )
            delta = [(code[i] - code_cf[i]).numpy() for i in range(2)]
        cont = change_agreement(delta[0], delta[1])
        parts["cont"].append(cont)
        per_concept.append(
            {
                "concept": int(c),
                "rows": len(rows),
                "latent_a": latents[0].get(int(c)),
                "latent_b": latents[1].get(int(c)),
                "cont_intervention": pooled_agreement([cont]),
            }
        )
    matched = [latents[0].get(int(c)) == latents[1].get(int(c)) for c in shared]
    latent = pooled_agreement(parts["latent"])
    decoded = pooled_agreement(parts["decoded"])
    return {
        "tr_intervention": latent if truth.exact else decoded,
        "tr_latent_ablation": latent,
        "tr_intervention_decoded": decoded,
        "tr_intervention_probe": pooled_agreement(parts["probe"]),
        "tr_intervention_input": pooled_agreement(parts["input"]),
        "cont_intervention": pooled_agreement(parts["cont"]),
        "concept_match": float(np.mean(matched)) if matched else None,
        "n_shared_concepts": len(shared),
        "per_concept": per_concept,
    }


def probe_transfer(
    source_codes: np.ndarray,
    target_codes: np.ndarray,
    labels: np.ndarray,
    *,
    train_fraction: float = 0.5,
    seed: int = 0,
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


def sliced_wasserstein_np(
    x: np.ndarray, y: np.ndarray, n_projections: int = 256, seed: int = 0
) -> float:
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


DIRECTIONS = ((0, 1), (1, 0))


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


def evaluate_alignment(
    model,
    test: Sequence[np.ndarray],
    *,
    labels: np.ndarray,
    concepts: np.ndarray | None = None,
    truth=None,
    sw_projections: int = 256,
    probe_train_fraction: float = 0.5,
    seed: int = 0,
) -> dict:
    """Every metric of the study for a trained :class:`repdiag.alignment.methods.PairModel`.

    ``test`` holds the held-out pairs (normalised), ``labels`` the probe task, ``concepts`` the
    ground truth when known, ``truth`` (a :class:`repdiag.alignment.concepts.ConceptTruth`) what the
    intervention metrics need; without it they are None. Returns the per-domain/per-direction
    details and a ``summary`` of flat values averaged over domains or directions (the columns).
    """
    import torch

    names = ("a", "b")
    with torch.no_grad():
        xs = [torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in test]
        codes = [model.encode(i, x) for i, x in enumerate(xs)]
        recon = [model.decode(i, c).numpy() for i, c in enumerate(codes)]
        translated = {(i, j): model.decode(j, codes[i]).numpy() for i, j in DIRECTIONS}
        cycled = {(i, j): model.cycle(i, j, xs[i]).numpy() for i, j in DIRECTIONS}
    codes_np = [c.numpy() for c in codes]
    x_np = [x.numpy() for x in xs]
    n_latents = codes_np[0].shape[1]

    if truth is not None and concepts is None and truth.exact:
        concepts = truth.concepts
    extract = {}
    for i, name in enumerate(names):
        seen = (
            concepts[:, truth.present[i]]
            if truth is not None and concepts is not None
            else concepts
        )
        extract[name] = {
            "explained_variance": explained_variance(x_np[i], recon[i]),
            "l0": l0(codes_np[i]),
            "dead_latents": dead_latents(codes_np[i]),
            "dead_fraction": dead_latents(codes_np[i]) / n_latents,
            "mcc": mcc(codes_np[i], seen) if seen is not None else None,
        }
    arrow = {d: f"{names[d[0]]}->{names[d[1]]}" for d in DIRECTIONS}
    translation = {
        arrow[(i, j)]: {
            "r2": r2_score(x_np[j], translated[(i, j)]),
            "cosine": mean_cosine(translated[(i, j)], x_np[j]),
        }
        for i, j in DIRECTIONS
    }
    cycle = {
        f"{arrow[(i, j)]}->{names[i]}": r2_score(x_np[i], cycled[(i, j)]) for i, j in DIRECTIONS
    }
    probes = {
        arrow[(i, j)]: probe_transfer(
            codes_np[i], codes_np[j], labels, train_fraction=probe_train_fraction, seed=seed
        )
        for i, j in DIRECTIONS
    }
    consistency = {
        "jaccard": active_jaccard(codes_np[0], codes_np[1]),
        "code_correlation": code_correlation(codes_np[0], codes_np[1]),
        "code_correlation_unweighted": code_correlation(codes_np[0], codes_np[1], weighted=False),
        "probe": probes,
    }
    intervention = intervention_metrics(model, x_np, truth) if truth is not None else None
    half = len(x_np[0]) // 2
    distributional = {
        "sw_translation": {
            arrow[(i, j)]: sliced_wasserstein_np(translated[(i, j)], x_np[j], sw_projections, seed)
            for i, j in DIRECTIONS
        },
        "sw_codes": sliced_wasserstein_np(codes_np[0], codes_np[1], sw_projections, seed),
        "sw_floor": {
            name: sliced_wasserstein_np(x_np[i][:half], x_np[i][half:], sw_projections, seed)
            for i, name in enumerate(names)
        },
        "sw_scale": {name: total_variance(x_np[i]) for i, name in enumerate(names)},
    }
    summary = {
        **{
            key: (intervention or {}).get(key)
            for key in ("tr_intervention", "cont_intervention", "concept_match")
        },
        "explained_variance": _mean([extract[n]["explained_variance"] for n in names]),
        "l0": _mean([extract[n]["l0"] for n in names]),
        "dead_fraction": _mean([extract[n]["dead_fraction"] for n in names]),
        "mcc": _mean([extract[n]["mcc"] for n in names]),
        "tr_r2": _mean([v["r2"] for v in translation.values()]),
        "tr_cosine": _mean([v["cosine"] for v in translation.values()]),
        "jaccard": consistency["jaccard"],
        "code_correlation": consistency["code_correlation"],
        "code_correlation_unweighted": consistency["code_correlation_unweighted"],
        **{
            key: (intervention or {}).get(key)
            for key in (
                "tr_intervention_input",
                "tr_latent_ablation",
                "tr_intervention_decoded",
                "tr_intervention_probe",
            )
        },
        "attribute_probe_accuracy": _attribute_accuracy(truth),
        "probe_source": _mean([v["source"] for v in probes.values()]),
        "probe_transfer": _mean([v["transfer"] for v in probes.values()]),
        "probe_chance": _mean([v["chance"] for v in probes.values()]),
        "cycle_r2": _mean(list(cycle.values())),
        "sw_translation": _mean(list(distributional["sw_translation"].values())),
        "sw_codes": distributional["sw_codes"],
        "sw_floor": _mean(list(distributional["sw_floor"].values())),
        "sw_scale": _mean(list(distributional["sw_scale"].values())),
    }
    return {
        "extract": extract,
        "translation": translation,
        "cycle": cycle,
        "consistency": consistency,
        "distributional": distributional,
        "intervention": intervention,
        "summary": summary,
    }
