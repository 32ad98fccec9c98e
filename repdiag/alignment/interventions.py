"""Intervention metrics of the alignment study: the primary M_tr and M_cont (after InterVenchA).

Every intervention metric scores a predicted change ``p`` against a true change ``t`` with the
pooled agreement ``A = 1 - sum ||p - t||^2 / sum (||p||^2 + ||t||^2)`` over every intervention
(row, concept, direction): 1 iff ``p = t`` everywhere, 0 when the changes are orthogonal or one
is zero, -1 when opposite. The two sums are kept per held-out row (``row_parts``), so that
:mod:`repdiag.alignment.bootstrap` can resample rows.

Synthetic data (ground truth known, :class:`repdiag.alignment.concepts.ConceptTruth`)
    For each concept ``c`` both domains see and each held-out row where ``c`` is active, the
    true effect of ``c`` in domain i is ``t_i = g_i(W_i z) - g_i(W_i z_{-c})`` (``z_{-c}``: ``c``
    set to 0; scaled like the inputs), and the latent of ``c`` in domain i, ``l_i(c)``, is its
    partner in the Hungarian matching of domain i's latents to the concepts it sees (maximum
    total |corr| on the held-out codes, as for MCC).

    - ``tr_intervention`` (M_tr): ablate ``l_i(c)`` in ``c_i = E_i x_i`` and translate:
      ``p = D_j(c_i) - D_j(c_i with l_i(c) = 0)``, scored against ``t_j``; both directions.
    - ``tr_intervention_input``: the same with the intervention on the input,
      ``p = D_j E_i x_i - D_j E_i (x_i - t_i)`` (no latent identification needed).
    - ``cont_intervention`` (M_cont): remove ``c`` from both inputs and compare the code
      changes ``E_a x_a - E_a (x_a - t_a)`` and ``E_b x_b - E_b (x_b - t_b)``.
    - ``concept_match``: the fraction of shared concepts with ``l_a(c) = l_b(c)``.
Real embeddings (known image attributes, :class:`repdiag.alignment.real_pairs.ProbeTruth`)
    Each domain's effect ``t_i`` (difference of class means) and probe ``w_i`` of attribute
    ``a`` are fitted on the training images, and latents are matched to attributes there (on
    signed correlation); on the held-out rows that have ``a``, ``x_i - t_i`` is the
    counterfactual input.

    - ``tr_intervention`` (M_tr, the decoded input intervention): the translated change
      ``p = D_j E_i x_i - D_j E_i (x_i - t_i)`` against the target's own decoded change
      ``t = D_j E_j x_j - D_j E_j (x_j - t_j)``, row by row, both read out on
      ``u_j = t_j / ||t_j||^2``; a rotation of either domain rotates ``u_j`` along.
      ``tr_intervention_probe`` reads both out on the probe ``w_j`` instead.
    - ``tr_latent_ablation`` (a diagnostic): ``p = w_j . (D_j c_i - D_j c_i^{-l})`` against
      ``w_j . t_j``; ``tr_intervention_input``: ``w_j . (D_j E_i x_i - D_j E_i (x_i - t_i))``
      against ``w_j . t_j``.
    - ``cont_intervention`` compares the code changes of the two domains as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

DIRECTIONS = ((0, 1), (1, 0))
PARTS = {
    "latent": "tr_latent_ablation",
    "input": "tr_intervention_input",
    "decoded": "tr_intervention_decoded",
    "probe": "tr_intervention_probe",
    "cont": "cont_intervention",
}


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


def change_agreement(prediction: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """The two sums of ``A = 1 - sum ||p - t||^2 / sum (||p||^2 + ||t||^2)`` (error, total).

    Returned unreduced so that several interventions can be pooled; see :func:`pooled_agreement`.
    """
    error, total = row_agreement(prediction, truth)
    return float(error.sum()), float(total.sum())


def row_agreement(prediction: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (first axis): ``||p_r - t_r||^2`` and ``||p_r||^2 + ||t_r||^2``."""
    p = np.asarray(prediction, dtype=np.float64).reshape(len(prediction), -1)
    t = np.asarray(truth, dtype=np.float64).reshape(len(truth), -1)
    return np.sum((p - t) ** 2, axis=1), np.sum(p**2, axis=1) + np.sum(t**2, axis=1)


def pooled_agreement(parts: Sequence[tuple[float, float]]) -> float | None:
    """``1 - sum error / sum total`` over :func:`change_agreement` parts (None without any)."""
    error = sum(e for e, _ in parts)
    total = sum(t for _, t in parts)
    return float(1.0 - error / total) if total > 0 else None


class RowPool:
    """Per held-out row, the error and total of the agreement A of every intervention on it."""

    def __init__(self, n_rows: int) -> None:
        self.error = {key: np.zeros(n_rows) for key in PARTS}
        self.total = {key: np.zeros(n_rows) for key in PARTS}
        self.used = dict.fromkeys(PARTS, False)

    def add(self, key: str, rows: np.ndarray, prediction: np.ndarray, truth: np.ndarray) -> None:
        error, total = row_agreement(prediction, truth)
        np.add.at(self.error[key], rows, error)
        np.add.at(self.total[key], rows, total)
        self.used[key] = True

    def value(self, key: str) -> float | None:
        """``A`` pooled over every row (None when nothing was added or both changes are 0)."""
        if not self.used[key]:
            return None
        return pooled_agreement([(self.error[key].sum(), self.total[key].sum())])

    def parts(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{metric: (error per row, total per row)}`` of every part that was scored."""
        return {PARTS[k]: (self.error[k], self.total[k]) for k in PARTS if self.used[k]}


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


def _matched_latents(model, xs: Sequence[np.ndarray], truth) -> list[dict[int, int]]:
    """Each domain's concept -> latent matching on ``truth.matching_set`` (signed for real data)."""
    import torch

    latents = []
    for i in range(2):
        x, concepts = truth.matching_set(i, xs[i])
        with torch.no_grad():
            codes = model.encode(i, torch.as_tensor(np.asarray(x, dtype=np.float32))).numpy()
        latents.append(
            concept_latents(codes, np.asarray(concepts), truth.present[i], signed=not truth.exact)
        )
    return latents


def _score_concept(
    model, xs: Sequence[np.ndarray], truth, c: int, rows: np.ndarray, latents, pool: RowPool
) -> tuple[float, float]:
    """Every intervention on concept ``c`` at ``rows`` into ``pool``; its M_cont sums."""
    import torch

    true = [truth.change(i, rows, c) for i in range(2)]
    with torch.no_grad():
        code = [model.encode(i, torch.as_tensor(xs[i][rows])) for i in range(2)]
        code_cf = [model.encode(i, torch.as_tensor(xs[i][rows] - true[i])) for i in range(2)]
        for i, j in DIRECTIONS:
            ablated = code[i].clone()
            if c in latents[i]:
                ablated[:, latents[i][c]] = 0.0
            latent_change = (model.decode(j, code[i]) - model.decode(j, ablated)).numpy()
            input_change = (model.decode(j, code[i]) - model.decode(j, code_cf[i])).numpy()
            # the target's own decoded change: what j's dictionary makes of the intervention
            own_change = (model.decode(j, code[j]) - model.decode(j, code_cf[j])).numpy()
            readout = truth.readout(j, c)
            if readout is None:  # synthetic: whole vectors
                pool.add("latent", rows, latent_change, true[j])
                pool.add("input", rows, input_change, true[j])
                pool.add("decoded", rows, input_change, own_change)
                continue
            target = true[j] @ readout
            along = effect_readout(true[j][0])
            pool.add("latent", rows, latent_change @ readout, target)
            pool.add("input", rows, input_change @ readout, target)
            pool.add("decoded", rows, input_change @ along, own_change @ along)
            pool.add("probe", rows, input_change @ readout, own_change @ readout)
        delta = [(code[i] - code_cf[i]).numpy() for i in range(2)]
    pool.add("cont", rows, delta[0], delta[1])
    return change_agreement(delta[0], delta[1])


def intervention_metrics(
    model, test: Sequence[np.ndarray], truth, *, max_rows: int = 256
) -> dict[str, Any]:
    """The intervention metrics (module docstring): ``tr_intervention``, its parts
    ``tr_latent_ablation``, ``tr_intervention_decoded`` and ``tr_intervention_probe``,
    ``tr_intervention_input``, ``cont_intervention`` and ``concept_match``, plus ``row_parts``
    (per held-out row, the sums of A of each part: numpy arrays, not for a JSON record).

    ``truth`` is a :class:`~repdiag.alignment.concepts.ConceptTruth` (synthetic, ``exact``) or
    :class:`~repdiag.alignment.real_pairs.ProbeTruth` whose scales are those of ``test``; at most
    ``max_rows`` held-out rows per concept (``truth.rows``). M_tr is the latent ablation on
    synthetic data and the decoded input intervention on real embeddings.
    """
    xs = [np.asarray(x, dtype=np.float32) for x in test]
    latents = _matched_latents(model, xs, truth)
    pool = RowPool(len(xs[0]))
    per_concept = []
    for c in (int(c) for c in truth.shared):
        rows = truth.rows(c, max_rows)
        if len(rows) == 0:
            continue
        cont = _score_concept(model, xs, truth, c, rows, latents, pool)
        per_concept.append(
            {
                "concept": c,
                "rows": len(rows),
                "latent_a": latents[0].get(c),
                "latent_b": latents[1].get(c),
                "cont_intervention": pooled_agreement([cont]),
            }
        )
    matched = [latents[0].get(int(c)) == latents[1].get(int(c)) for c in truth.shared]
    parts = pool.parts()
    primary = "latent" if truth.exact else "decoded"
    if PARTS[primary] in parts:
        parts["tr_intervention"] = parts[PARTS[primary]]
    return {
        "tr_intervention": pool.value(primary),
        **{name: pool.value(key) for key, name in PARTS.items()},
        "concept_match": float(np.mean(matched)) if matched else None,
        "n_shared_concepts": len(truth.shared),
        "per_concept": per_concept,
        "row_parts": parts,
    }
