"""Fabricated inputs of the statistics stage, in exactly the formats of docs/contracts.md.

``write_fake_results(root, models)`` writes ``results/metrics/<model>.json`` and
``results/jacobians/<model>.zarr`` (plus ``results/zoo/<objective>/curve.csv`` for zoo models)
under ``root``. Each model gets a hidden quality q in [0, 1]: its singular-value spectra decay
more slowly (higher JER) and its binding and Same/Different accuracies rise with q, while the
geometry metrics are independent noise, like the paper's finding.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from repdiag.binding.analysis.depth import depth_table
from repdiag.binding.analysis.options import StatsSettings
from repdiag.core.store import write_json, write_store

FAMILIES = (
    "variance_decorrelation",
    "masked_modeling",
    "clustering_distillation",
    "contrastive",
    "vision_language",
    "supervised",
)
SETTINGS = StatsSettings.from_config(
    {"n_bootstrap": 200, "seed": 0, "covariates": ["zero_shot_accuracy"]}
)
"""The analysis settings of the binding tests: few resamples, one covariate."""
LAYERS = ("block00", "block01", "block02", "block03", "final")
K_VALUES = (5, 10, 20)


def fake_models(n: int) -> dict[str, dict[str, Any]]:
    """``n`` config entries cycling through the families, zoo sources, one covariate."""
    models = {}
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        models[f"m{i:02d}"] = {
            "source": "zoo",
            "id": f"obj{i:02d}",
            "family": family,
            "covariates": {"zero_shot_accuracy": 0.3 + 0.05 * i},
        }
    return models


def jer_formulas(singular_values: np.ndarray) -> dict[str, np.ndarray]:
    """The three JER formulas of the contracts on the last axis (sum s)^2/sum s^2, ..."""
    s = singular_values.astype(float)
    p = s / s.sum(-1, keepdims=True)
    return {
        "jer_pr": s.sum(-1) ** 2 / (s**2).sum(-1),
        "jer_pr2": (s**2).sum(-1) ** 2 / (s**4).sum(-1),
        "jer_entropy": np.exp(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)),
    }


def fake_jacobian_store(
    path: Path,
    quality: float,
    rng: np.random.Generator,
    *,
    n_binding: int = 6,
    n_noise: int = 3,
    k: int = 12,
) -> None:
    """A jacobian store: spectra s_i = exp(-i / tau) with tau growing with ``quality``."""
    n_images = n_binding + n_noise
    rank = np.arange(k)
    taus = np.array([4.0, 3.5, 3.0, 2.0 + 6.0 * quality, 1.0 + 6.0 * quality])
    noise = rng.uniform(0.9, 1.1, size=(len(LAYERS), n_images, 1))
    sv = np.exp(-rank / (taus[:, None, None] * noise)) * rng.uniform(
        1, 3, size=(len(LAYERS), n_images, 1)
    )
    sv = np.sort(sv, axis=-1)[..., ::-1].astype(np.float32)
    jers = jer_formulas(sv)
    images = [f"query/q{i:05d}" for i in range(n_binding)] + [
        f"noise/n{i:05d}" for i in range(n_noise)
    ]
    ds = xr.Dataset(
        {"singular_values": (("layer", "image", "rank"), sv)}
        | {name: (("layer", "image"), value.astype(np.float32)) for name, value in jers.items()},
        coords={
            "layer": list(LAYERS),
            "image": images,
            "probe_set": ("image", ["binding"] * n_binding + ["noise"] * n_noise),
            "rank": rank,
        },
        attrs={
            "k": k,
            "power_iters": 5,
            "seed": 0,
            "device": "cpu",
            "method": {name: "exact" for name in LAYERS},
        },
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The data type", category=UserWarning)
        write_store(path, ds, seed=0)


def fake_metrics(
    key: str, entry: Mapping[str, Any], quality: float, rng: np.random.Generator
) -> dict[str, Any]:
    """A metrics JSON for one model (contracts.md schema)."""
    chance = 0.125
    per_layer = {}
    for depth, layer in enumerate(LAYERS):
        scale = (depth + 1) / len(LAYERS)
        binding = {}
        for offset, readout in enumerate(("cosine", "knn", "local_pca")):
            accuracy = float(
                np.clip(chance + 0.5 * quality * scale + rng.normal(0, 0.02) - 0.01 * offset, 0, 1)
            )
            # the win rate's own noise, from a generator of its own: the shared draws (and every
            # value other tests read from them) stay as they were before it was added
            noise = np.random.default_rng(zlib.crc32(f"{key}/{layer}/{readout}".encode()))
            win = float(np.clip(0.5 + 0.45 * quality * scale + noise.normal(0, 0.05), 0, 1))
            binding[readout] = {
                "accuracy": accuracy,
                "ci_low": max(0.0, accuracy - 0.05),
                "ci_high": min(1.0, accuracy + 0.05),
                "n": 64,
                "win_rate": win,
                "win_rate_ci_low": max(0.0, win - 0.03),
                "win_rate_ci_high": min(1.0, win + 0.03),
            }
        per_layer[layer] = {
            "geometry": {
                "g_pr": float(rng.uniform(0.05, 0.6)),
                "g_iso": float(rng.uniform(0.3, 0.95)),
                "l_iso": {str(k): float(rng.uniform(0.2, 0.9)) for k in K_VALUES},
                "effective_rank": float(rng.uniform(5, 40)),
                "participation_ratio": float(rng.uniform(3, 30)),
            },
            "binding": binding,
            "same_different": {
                "accuracy": (same := float(0.55 + 0.35 * quality + rng.normal(0, 0.03))),
                "ci_low": same - 0.04,
                "ci_high": same + 0.04,
                "ci_method": "wilson",
                "n": 512,
                "hits": round(512 * same),
                "p_value": 0.01,
                "above_chance": same - 0.04 > 0.5,
                "folds": 5,
                "inner_folds": 3,
                "fold_accuracy": [same] * 5,
                "fold_C": [0.1] * 5,
            },
        }
    return {
        "model": key,
        "family": entry["family"],
        "source": entry["source"],
        "config": {"readouts": ["cosine", "knn", "local_pca"]},
        "chance": chance,
        "sizes": {"n_queries": 64, "n_candidates": 8, "n_pairs": 64, "n_reference": 128},
        "layers": list(LAYERS),
        "final_layer": "final",
        "per_layer": per_layer,
    }


def write_fake_results(
    root: Path, models: Mapping[str, Mapping[str, Any]], seed: int = 0
) -> dict[str, float]:
    """Write every input of the statistics stage under ``root``; returns each model's quality."""
    rng = np.random.default_rng(seed)
    qualities = {}
    for i, (key, entry) in enumerate(models.items()):
        quality = float((i * 0.37 + 0.1) % 1.0)
        qualities[key] = quality
        write_json(
            root / "results" / "metrics" / f"{key}.json", fake_metrics(key, entry, quality, rng)
        )
        fake_jacobian_store(root / "results" / "jacobians" / f"{key}.zarr", quality, rng)
        if entry.get("source") == "zoo":
            curve = root / "results" / "zoo" / entry["id"] / "curve.csv"
            curve.parent.mkdir(parents=True, exist_ok=True)
            steps = np.arange(1, 11)
            pd.DataFrame({"step": steps, "loss": 2.0 / steps + quality}).to_csv(curve, index=False)
    return qualities


def model_paths(root: Path, models: Mapping[str, Any]) -> tuple[dict[str, Path], dict[str, Path]]:
    metrics = {key: root / "results" / "metrics" / f"{key}.json" for key in models}
    jacobians = {key: root / "results" / "jacobians" / f"{key}.zarr" for key in models}
    return metrics, jacobians


def depth_profile(per_image: np.ndarray) -> pd.DataFrame:
    """The depth table of one model from per-image JER (layer, image), as aggregate builds it."""
    n_layers, n_images = per_image.shape
    ds = xr.Dataset(
        {"jer_pr": (("layer", "image"), per_image)},
        coords={
            "layer": [f"block{i:02d}" for i in range(n_layers)],
            "image": [f"query/q{i:05d}" for i in range(n_images)],
            "probe_set": ("image", ["binding"] * n_images),
        },
    )
    depth = depth_table(ds, "m", "vision_language", confidence=SETTINGS.confidence)
    return depth[(depth.formula == "pr") & (depth.probe_set == "binding")]
