"""Did a zoo run learn? The checks recorded in its ``meta.json`` (``learning``).

1. **Off the plateau** (this decides ``learned``). The mean loss of the last tenth of the steps
   must lie at least PLATEAU_MARGIN (relative) below both the loss at step 0 and the loss of the
   objective's trivial solution (``Objective.trivial_loss``: collapsed embeddings, chance
   predictions, the median pixel), so a run that sits at the entropy of its label prior, or at
   its initial loss, is not taken as learned.
2. **Features against the random network** (a diagnostic). A linear probe of per-slot shape
   (which of the scene shapes, or none, sits in each grid slot) on the frozen pooled features of
   N_PROBE held-out pretraining scenes (the stream's batch 0 under seed ``scenes.seed +
   PROBE_SEED_OFFSET``, never trained on), fitted on one half and scored on the other, beside
   the same probe on the run's random-initialised backbone. It is recorded, not a condition of
   ``learned``: per-slot shape is what the binding benchmark asks for, so selecting runs on it
   would select on (a proxy of) the outcome the statistics try to explain, and objectives whose
   targets are position-free (bag-of-words captions, DINO, masked pixels) need not raise it.

A zero-step run is the random network itself: it never leaves its plateau.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from repdiag.encoders.zoo.scenes import SceneSettings, scene_batch

PLATEAU_MARGIN = 0.05
PROBE_MARGIN = 0.02
N_PROBE = 1024
PROBE_SEED_OFFSET = 10_000
PROBE_C = 1.0


def plateau_check(
    losses: Sequence[float], trivial_loss: float, margin: float = PLATEAU_MARGIN
) -> dict[str, Any]:
    """``left_plateau``: mean of the last tenth of ``losses`` <= (1 - margin) * min(loss at step 0,
    ``trivial_loss``). A single loss (a zero-step run) never leaves its plateau."""
    initial = float(losses[0])
    tail = max(1, len(losses) // 10)
    final = float(np.mean(losses[-tail:]))
    reference = min(initial, trivial_loss) if math.isfinite(trivial_loss) else initial
    left = len(losses) > 1 and final <= (1.0 - margin) * reference
    return {
        "initial_loss": initial,
        "final_loss_mean": final,
        "trivial_loss": float(trivial_loss),
        "left_plateau": bool(left),
    }


@torch.no_grad()
def pooled_features(
    backbone: nn.Module, images: np.ndarray, mean: Sequence[float], std: Sequence[float]
) -> np.ndarray:
    """(N, D) float64: ``backbone`` in eval mode on ``images`` uint8 (N, H, W, 3) normalised."""
    training = backbone.training
    backbone.eval()
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    features = torch.cat([backbone(x[i : i + 256]) for i in range(0, len(x), 256)])
    backbone.train(training)
    return features.double().numpy()


def slot_probe_accuracy(features: np.ndarray, slot_shape: np.ndarray) -> float:
    """Mean over slots of the held-out accuracy of a multinomial logistic regression (standardised
    features, C = PROBE_C) predicting ``slot_shape[:, s]`` (0 empty, 1 + shape); first half fits,
    second half scores."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    half = len(features) // 2
    scores = []
    for slot in range(slot_shape.shape[1]):
        labels = slot_shape[:, slot]
        if np.unique(labels[:half]).size < 2:
            scores.append(float(np.mean(labels[half:] == labels[0])))
            continue
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, max_iter=2000))
        # one BLAS thread: at this size OpenBLAS threads only contend (18x slower on 2 cores)
        with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
            warnings.simplefilter("ignore", ConvergenceWarning)
            probe.fit(features[:half], labels[:half])
        scores.append(float(probe.score(features[half:], labels[half:])))
    return float(np.mean(scores))


def same_weights(first: nn.Module, second: nn.Module) -> bool:
    """Whether two modules hold the same tensors under the same names, bit for bit."""
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def probe_check(
    trained: nn.Module,
    initial: nn.Module,
    scenes: SceneSettings,
    scene_seed: int,
    mean: Sequence[float],
    std: Sequence[float],
    margin: float = PROBE_MARGIN,
    n_images: int = N_PROBE,
) -> dict[str, Any]:
    """Per-slot shape probe accuracy of the trained and the random-initialised backbone (probed
    once when their weights are equal: a run of 0 steps is its initialisation)."""
    batch = scene_batch(scenes, scene_seed + PROBE_SEED_OFFSET, 0, n_images)

    def probe(model: nn.Module) -> float:
        return slot_probe_accuracy(
            pooled_features(model, batch.images, mean, std), batch.slot_shape
        )

    accuracy = {"trained": probe(trained)}
    accuracy["random_init"] = (
        accuracy["trained"] if same_weights(trained, initial) else probe(initial)
    )
    return {
        "slot_probe_accuracy": accuracy["trained"],
        "slot_probe_accuracy_random_init": accuracy["random_init"],
        "slot_probe_gain": accuracy["trained"] - accuracy["random_init"],
        "beats_random_init": bool(accuracy["trained"] >= accuracy["random_init"] + margin),
        "probe_images": n_images,
    }


def learning_record(plateau: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
    """The ``learning`` entry of meta.json: both checks, ``learned`` = off the plateau."""
    return {
        **plateau,
        **probe,
        "learned": bool(plateau["left_plateau"]),
        "rule": (
            f"learned: mean loss of the last tenth of the steps <= {1 - PLATEAU_MARGIN:.2f} x "
            f"min(loss at step 0, trivial loss); per-slot shape probe reported beside the random "
            f"init (beats_random_init: gain >= {PROBE_MARGIN})"
        ),
    }
