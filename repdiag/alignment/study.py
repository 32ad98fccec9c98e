"""Running the alignment study: one synthetic cell, or every variant on a real-embedding pair."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from repdiag.alignment.bootstrap import intervals, mean_intervals
from repdiag.alignment.concepts import PairedData, SyntheticConcepts, synthetic_pairs
from repdiag.alignment.grid import EXACT_VARIANT, real_pair_name, split_variant, uses_pairs
from repdiag.alignment.methods import PairModel, SAESettings, make_method
from repdiag.alignment.metrics import EvaluationSettings, evaluate_alignment
from repdiag.alignment.real_pairs import PairSplit, embedding_pairs, random_rotation
from repdiag.alignment.train import SAETrainSettings, normalise, train_method
from repdiag.common.intervals import bootstrap_counts
from repdiag.core.errors import ConfigError

log = logging.getLogger(__name__)


def _three_decimals(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _log_summary(variant: str, summary: Mapping[str, Any]) -> None:
    log.info(
        "%s: EV %.3f, M_tr (intervention) %s, M_cont (intervention) %s, R2 %.3f, Jaccard %.3f, "
        "cycle R2 %.3f",
        variant,
        summary["explained_variance"],
        _three_decimals(summary["tr_intervention"]),
        _three_decimals(summary["cont_intervention"]),
        summary["tr_r2"],
        summary["jaccard"],
        summary["cycle_r2"],
    )


def exact_translator(model: PairModel, rotation: np.ndarray) -> PairModel:
    """Domain a's SAE for both domains, b's in b's basis (x_b = x_a Q): W_enc,b = W_enc,a Q,
    D_b = Q^T D_a, b_dec,b = b_dec,a Q, so that D_b E_a x_a = (D_a E_a x_a) Q exactly. On a
    control pair (b = a rotated) it is each metric's ceiling with a's dictionary."""
    q = torch.as_tensor(np.asarray(rotation), dtype=torch.float32)
    sae_a = copy.deepcopy(model.saes[0])
    sae_b = copy.deepcopy(model.saes[0])
    with torch.no_grad():
        sae_b.encoder.copy_(sae_a.encoder @ q)
        sae_b.decoder.copy_(q.T @ sae_a.decoder)
        sae_b.b_dec.copy_(sae_a.b_dec @ q)
    return PairModel([sae_a, sae_b])


def fit_and_evaluate(
    variant: str,
    data: PairedData,
    *,
    sae: Mapping[str, Any],
    train: Mapping[str, Any],
    weights: Mapping[str, float] | None,
    evaluation: Mapping[str, Any],
    seed: int,
    device: torch.device | str = "cpu",
    exact_rotation: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> dict[str, Any]:
    """Train one variant on normalised ``data`` and compute every metric on its held-out pairs.

    With ``exact_rotation`` Q (a control pair, x_b = x_a Q), the trained model's b side is
    replaced by its a side in b's basis (:func:`exact_translator`) before the evaluation: the
    record is the exact translator's, variant ``exact-translator``. With ``counts`` (bootstrap
    resamples of the held-out rows) the record carries ``bootstrap_draws`` (numpy arrays, for
    the caller to turn into intervals and drop before writing)."""
    method_name, ablation = split_variant(variant)
    train_settings = SAETrainSettings.from_config(train)
    method = make_method(
        method_name,
        SAESettings.from_config(sae),
        ablation=ablation,
        weights=weights,
        sw_projections=train_settings.sw_projections,
    )
    if method.uses_pairs and data.n_paired == 0:
        raise ConfigError(f"{variant} needs anchor pairs but the paired fraction gives none")
    log.info("training %s (%d anchor pairs, seed %d)", variant, data.n_paired, seed)
    result = train_method(method, data, train_settings, seed=seed, device=device)
    model = result.model.cpu()
    if exact_rotation is not None:
        model = exact_translator(model, exact_rotation)
    start = time.monotonic()
    metrics = evaluate_alignment(
        model,
        data.test,
        labels=data.test_labels,
        concepts=data.test_concepts,
        truth=data.truth,
        settings=EvaluationSettings.from_config(evaluation),
        seed=seed,
        bootstrap_counts=counts,
    )
    draws = metrics.pop("bootstrap_draws", None)
    summary = metrics["summary"]
    _log_summary(variant, summary)
    method, ablation = split_variant(variant)
    if exact_rotation is not None:
        variant, method, ablation = EXACT_VARIANT, "exact", None
    record = {
        "variant": variant,
        "method": method,
        "ablation": ablation,
        "n_paired": data.n_paired,
        "n_train": [len(x) for x in data.train],
        "n_test": len(data.test[0]),
        "train": {
            "steps": train_settings.steps,
            "wall_time_s": result.wall_time_s,
            "final_terms": result.final_terms,
            "curve": result.curve,
            "finalise": result.finalise_info,
        },
        "eval_wall_time_s": time.monotonic() - start,
        "metrics": {k: v for k, v in metrics.items() if k != "summary"},
        "summary": summary,
    }
    if draws is not None:
        record["bootstrap_draws"] = draws
    return record


def run_cell(
    params: Mapping[str, Any], device: torch.device | str = "cpu", lr: float | None = None
) -> dict[str, Any]:
    """One synthetic cell from its :func:`cell_params`; the JSON written to results/alignment/.

    ``lr`` (the learning rate :mod:`repdiag.alignment.tuning` picked for the variant) replaces
    ``train.lr``; the record says which one was used (``train.lr``, ``train.lr_source``).
    """
    cell = params["cell"]
    train = dict(params["train"])
    if lr is not None:
        train["lr"] = float(lr)
    start, cpu_start = time.monotonic(), time.process_time()
    space = SyntheticConcepts.from_config(params["synthetic"])
    data = synthetic_pairs(space, cell["paired_fraction"], cell["seed"])
    data, scales = normalise(data)
    record = fit_and_evaluate(
        cell["variant"],
        data,
        sae=params["sae"],
        train=train,
        weights=params["weights"],
        evaluation=params["evaluation"],
        seed=cell["seed"],
        device=device,
    )
    record["train"].update(lr=float(train["lr"]), lr_source="config" if lr is None else "tuning")
    return {
        "cell": cell["name"],
        "data": "synthetic",
        "paired_fraction": cell["paired_fraction"],
        "seed": cell["seed"],
        **record,
        "input_scales": list(scales),
        "wall_time_s": time.monotonic() - start,
        "cpu_time_s": time.process_time() - cpu_start,
        "params": dict(params),
    }


def real_seeds(params: Mapping[str, Any]) -> list[int]:
    """The seeds of a real pair's job (``alignment.real.seeds``), in config order."""
    return [int(seed) for seed in params["seeds"]]


def pair_data(
    params: Mapping[str, Any],
    stores: tuple[str | Path, str | Path],
    fraction: float,
    attributes: Any,
    truth: Any,
    *,
    seed: int,
    control: str,
) -> PairedData:
    """:func:`embedding_pairs` of a real pair's params at paired fraction ``fraction`` and one
    seed (its split, rotation and shuffle); ``control`` ``rotation`` rotates b, ``shuffle``
    rotates b and permutes its training rows, ``exact`` rotates b only (the exact translator's
    data: the rotation control's)."""
    split = PairSplit(
        layer=params["pair"].get("layer", "final"),
        paired_fraction=fraction,
        test_fraction=params["test_fraction"],
        seed=seed,
        image_sets=params["image_sets"] or None,
        max_images=params["max_images"],
    )
    return embedding_pairs(
        stores[0],
        stores[1],
        split,
        control=control,
        n_clusters=params["n_clusters"],
        attributes=attributes,
        min_accuracy=float(params["decodable_accuracy"]),
        reuse_truth=truth,
    )


def exact_ceiling(
    params: Mapping[str, Any],
    stores: tuple[str | Path, str | Path],
    attributes: Any,
    truth: Any,
    *,
    seed: int,
    counts: np.ndarray | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """The exact translator's record on a control pair at one seed (b = a in the seed's basis
    Q): an independent SAE of domain a trained on every training row, copied into b's basis."""
    data, _ = normalise(
        pair_data(params, stores, 1.0, attributes, truth, seed=seed, control="exact")
    )
    rotation = random_rotation(data.test[1].shape[1], seed)
    record = fit_and_evaluate(
        "independent",
        data,
        sae=params["sae"],
        train=params["train"],
        weights=None,
        evaluation=params["evaluation"],
        seed=seed,
        device=device,
        exact_rotation=rotation,
        counts=counts,
    )
    return {"paired_fraction": 1.0, "seed": seed, **record}


def _real_seed(
    params: Mapping[str, Any],
    stores: tuple[str | Path, str | Path],
    attributes: Any,
    seed: int,
    device: torch.device | str,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every variant x paired fraction (and, on a control pair, the exact translator) at one
    seed: one split, one attribute fit, one set of bootstrap resamples shared by every run (so
    that differences between variants are paired)."""
    control = params["pair"].get("control", "none")
    bootstrap = params["bootstrap"]
    runs, info, truth, counts = [], None, None, None
    fractions = sorted(set(params["paired_fractions"]))
    for variant in params["variants"]:
        for fraction in fractions if uses_pairs(variant) else [0.0]:
            data = pair_data(
                params, stores, fraction, attributes, truth, seed=seed, control=control
            )
            if info is None:  # the split is the same for every fraction: record it once
                info = {k: v for k, v in data.info.items() if k != "paired_fraction"}
                truth = data.truth
                counts = bootstrap_counts(len(data.test[0]), int(bootstrap["resamples"]), [seed, 6])
            data, _ = normalise(data)
            record = fit_and_evaluate(
                variant,
                data,
                sae=params["sae"],
                train=params["train"],
                weights=params["weights"].get(variant),
                evaluation=params["evaluation"],
                seed=seed,
                device=device,
                counts=counts,
            )
            runs.append({"paired_fraction": float(fraction), "seed": seed, **record})
    if control != "none":
        runs.append(
            exact_ceiling(
                params, stores, attributes, truth, seed=seed, counts=counts, device=device
            )
        )
    for run in runs:
        run["intervals"] = intervals(run["bootstrap_draws"], float(bootstrap["confidence"]))
    return runs, info


def seed_intervals(runs: list[dict[str, Any]], confidence: float) -> list[dict[str, Any]]:
    """Per variant and paired fraction, the bootstrap interval of the mean over seeds
    (:func:`repdiag.alignment.bootstrap.mean_intervals`), from the runs' ``bootstrap_draws``."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["variant"], run["paired_fraction"]), []).append(run)
    return [
        {
            "variant": variant,
            "paired_fraction": fraction,
            "n_seeds": len(group),
            "intervals": mean_intervals([r["bootstrap_draws"] for r in group], confidence),
        }
        for (variant, fraction), group in groups.items()
    ]


def run_real(
    params: Mapping[str, Any],
    store_a: str | Path,
    store_b: str | Path,
    device: torch.device | str = "cpu",
    attributes: tuple[Any, list[str], Any] | None = None,
) -> dict[str, Any]:
    """Every variant x paired fraction x seed on one pair of embedding stores (one job, one JSON).

    Each seed draws its own split, attribute fit, control basis and SAE initialisation. Every
    run carries the percentile bootstrap interval of each row-additive metric over the
    held-out rows (``intervals``); ``seed_intervals`` gives, per variant and fraction, the
    interval of the mean over seeds. ``attributes`` ``(ids, names, indicators)``, the images'
    known attributes (the binding store's shape-in-slot indicators, read by the workflow script),
    feed the intervention metrics; without them those are not computed.
    """
    pair = params["pair"]
    start, cpu_start = time.monotonic(), time.process_time()
    runs, infos = [], []
    for seed in real_seeds(params):
        log.info("%s: seed %d", real_pair_name(pair), seed)
        seed_runs, info = _real_seed(params, (store_a, store_b), attributes, seed, device)
        runs.extend(seed_runs)
        infos.append(info)
    confidence = float(params["bootstrap"]["confidence"])
    pooled = seed_intervals(runs, confidence)
    for run in runs:
        del run["bootstrap_draws"]
    return {
        "pair": real_pair_name(pair),
        "data": "real",
        "a": pair["a"],
        "b": pair["b"],
        "layer": pair.get("layer", "final"),
        "control": pair.get("control", "none"),
        "seeds": real_seeds(params),
        "bootstrap": {**params["bootstrap"], "unit": "held-out rows (image pairs)"},
        "data_info": infos,
        "runs": runs,
        "seed_intervals": pooled,
        "wall_time_s": time.monotonic() - start,
        "cpu_time_s": time.process_time() - cpu_start,
        "params": dict(params),
    }
