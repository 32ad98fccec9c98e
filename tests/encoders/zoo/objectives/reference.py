"""Independent references for the zoo loss tests: fixed random inputs, float64 tensors, a loop
log-softmax."""

from __future__ import annotations

import math

import numpy as np
import torch


def fixed(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def log_softmax(row: np.ndarray) -> np.ndarray:
    m = row.max()
    return row - m - math.log(sum(math.exp(v - m) for v in row))
