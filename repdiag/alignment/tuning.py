"""Learning rate per alignment variant, picked on a validation split of the training rows.

For one variant, at one seed and one paired fraction (``alignment.tuning``), every learning rate
of ``lrs`` trains the variant with the grid's settings on the training rows minus a validation
split, and the one with the lowest *validation objective* is picked:

    V(lr) = mean over ``VALIDATION_REPEATS`` draws of sum_t w_t L_t(validation rows)

with ``L_t`` the variant's own loss terms (:mod:`repdiag.alignment.methods`, AuxK left out: it
scores dead latents, not the fit) evaluated without gradient on the validation split. The
split holds out ``validation_fraction`` of the unpaired rows of each domain and of the anchor
pairs (at least one pair when there are two or more), so each method is judged by what it
optimises, on rows it never trained on, with no ground truth and no test row. Methods that
train on pairs alone (Crosscoder, USAE) are scored on the validation pairs; the others on the
validation unpaired rows, with the validation pairs for CoSAE's pair terms.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from repdiag.alignment.concepts import PairedData, SyntheticConcepts, synthetic_pairs
from repdiag.alignment.grid import split_variant
from repdiag.alignment.methods import Batch, Method, PairModel, SAESettings, make_method
from repdiag.alignment.train import SAETrainSettings, normalise, train_method
from repdiag.core.errors import ConfigError

log = logging.getLogger(__name__)

VALIDATION_REPEATS = 4


def validation_split(
    data: PairedData, fraction: float
) -> tuple[PairedData, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """``(training data, validation rows per domain, validation pairs or None)``.

    The last ``fraction`` of the anchor pairs and of each domain's unpaired rows are held out;
    training keeps the rest, its pairs still first.
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(
            f"alignment.tuning.validation_fraction must lie in (0, 1), got {fraction}"
        )
    n_paired = data.n_paired
    n_val_pairs = max(1, round(fraction * n_paired)) if n_paired >= 2 else 0
    train_rows, validation_rows = [], []
    for x in data.train:
        n_val = max(1, round(fraction * (len(x) - n_paired)))
        keep = np.r_[0 : n_paired - n_val_pairs, n_paired : len(x) - n_val]
        train_rows.append(x[keep])
        validation_rows.append(x[len(x) - n_val :])
    pairs = None
    if n_val_pairs:
        pairs = tuple(x[n_paired - n_val_pairs : n_paired] for x in data.train)
    train = replace(data, train=tuple(train_rows), n_paired=n_paired - n_val_pairs)
    return train, tuple(validation_rows), pairs  # type: ignore[return-value]


def validation_objective(
    method: Method,
    model: PairModel,
    rows: Sequence[np.ndarray],
    pairs: Sequence[np.ndarray] | None,
    *,
    seed: int,
) -> dict[str, float]:
    """The variant's weighted loss terms on held-out rows (AuxK excluded), and their sum."""
    as_tensor = [torch.as_tensor(x) for x in rows]
    pair_tensors = None if pairs is None else tuple(torch.as_tensor(x) for x in pairs)
    if method.trains_on_pairs and pair_tensors is None:
        raise ConfigError(f"{method.name} needs validation pairs: raise the tuning paired fraction")
    if method.needs_pairs and method.trains_on_pairs:
        batch = Batch(x=pair_tensors, pairs=pair_tensors)  # type: ignore[arg-type]
    else:
        batch = Batch(x=tuple(as_tensor), pairs=pair_tensors if method.trains_on_pairs else None)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    totals: dict[str, float] = {}
    model.eval()
    with torch.no_grad():
        for _ in range(VALIDATION_REPEATS):
            terms = method.loss_terms(model, batch, generator)
            for name, value in terms.items():
                if name != "auxk":
                    totals[name] = totals.get(name, 0.0) + method.weight(name) * float(value)
    terms = {name: value / VALIDATION_REPEATS for name, value in totals.items()}
    return {"objective": float(sum(terms.values())), **terms}


def tune_learning_rate(
    params: Mapping[str, Any], device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Train one variant at every ``tuning.lrs`` and pick the lowest validation objective."""
    variant = params["variant"]
    tuning = params["tuning"]
    method_name, ablation = split_variant(variant)
    space = SyntheticConcepts.from_config(params["synthetic"])
    data = synthetic_pairs(space, tuning["paired_fraction"], tuning["seed"])
    data, _ = normalise(data)
    train_data, rows, pairs = validation_split(data, float(tuning["validation_fraction"]))
    settings = SAETrainSettings.from_config(params["train"])
    runs = []
    for lr in tuning["lrs"]:
        method = make_method(
            method_name,
            SAESettings.from_config(params["sae"]),
            ablation=ablation,
            weights=params["weights"],
            sw_projections=settings.sw_projections,
        )
        try:
            result = train_method(
                method,
                train_data,
                replace(settings, lr=float(lr)),
                seed=tuning["seed"],
                device=device,
            )
        except FloatingPointError as error:  # a rate too large: recorded, never picked
            log.warning("%s lr %g: %s", variant, lr, error)
            runs.append({"lr": float(lr), "validation": {"objective": None}, "diverged": True})
            continue
        model = result.model.cpu()
        scores = validation_objective(method, model, rows, pairs, seed=tuning["seed"])
        log.info("%s lr %g: validation objective %.5f", variant, lr, scores["objective"])
        runs.append({"lr": float(lr), "validation": scores, "wall_time_s": result.wall_time_s})
    picked, at_edge = pick_learning_rate(runs, variant)
    return {
        "variant": variant,
        "picked_lr": picked,
        "picked_at_edge": at_edge,
        "default_lr": float(params["train"]["lr"]),
        "runs": runs,
        "n_train": [len(x) for x in train_data.train],
        "n_train_pairs": train_data.n_paired,
        "n_validation": [len(x) for x in rows],
        "n_validation_pairs": 0 if pairs is None else len(pairs[0]),
        "params": dict(params),
    }


def pick_learning_rate(runs: Sequence[Mapping[str, Any]], variant: str) -> tuple[float, bool]:
    """The rate of lowest finite validation objective, and whether it is the range's end.

    A diverged rate (objective ``None`` or non-finite) cannot be picked; all diverged is an error. A pick at
    the smallest or largest rate offered means the optimum may lie outside the range: warned.
    """
    lrs = [float(run["lr"]) for run in runs]
    objectives = np.array(
        [
            np.nan if run["validation"]["objective"] is None else run["validation"]["objective"]
            for run in runs
        ],
        dtype=float,
    )
    finite = np.isfinite(objectives)
    if not finite.any():
        raise FloatingPointError(f"{variant}: every learning rate diverged ({lrs})")
    for lr in np.asarray(lrs)[~finite]:
        log.warning(
            "%s: lr %g diverged (non-finite validation objective); not pickable", variant, lr
        )
    picked = lrs[int(np.argmin(np.where(finite, objectives, np.inf)))]
    at_edge = picked in (min(lrs), max(lrs))
    if at_edge:
        log.warning(
            "%s: picked lr %g is at the end of alignment.tuning.lrs %s; widen the range",
            variant,
            picked,
            sorted(lrs),
        )
    return picked, at_edge


def lr_table(records: Sequence[Mapping[str, Any]]):
    """One row per variant and learning rate: the validation objective and which one was picked."""
    import pandas as pd

    rows = []
    for record in records:
        for run in record["runs"]:
            rows.append(
                {
                    "variant": record["variant"],
                    "lr": run["lr"],
                    "validation_objective": run["validation"]["objective"],
                    "picked": run["lr"] == record["picked_lr"],
                    "picked_at_range_end": bool(record.get("picked_at_edge", False)),
                    "is_default": run["lr"] == record["default_lr"],
                    "n_validation_rows": record["n_validation"][0],
                    "n_validation_pairs": record["n_validation_pairs"],
                }
            )
    return pd.DataFrame(rows)
