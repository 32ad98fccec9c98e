"""Linear probe: multinomial logistic regression on frozen features (scikit-learn).

The standard linear evaluation of SimCLR (Chen et al. 2020, section 4 / appendix B.6): fit a
linear classifier on the frozen representations of the train split, report accuracy on the test
split. Features are standardised with the train split's mean and standard deviation (optional),
then ``LogisticRegression`` (L2 penalty, inverse strength ``C``, L-BFGS) is fitted. Chance is
1 / n_classes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from repdiag.core.errors import ConfigError
from repdiag.core.settings import FromConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LinearProbeSettings(FromConfig):
    """``cifar.probe``: the logistic regression's settings, and the feature extraction's batch."""

    SECTION = "cifar.probe"

    C: float  # inverse L2 regularisation strength
    max_iter: int  # L-BFGS iterations
    standardize: bool  # standardise features with the train split's mean and standard deviation
    batch_size: int  # images per forward pass when extracting the features


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    accuracy: float  # on the test split
    train_accuracy: float
    chance: float
    n_train: int
    n_test: int
    n_classes: int
    n_iter: int
    converged: bool
    wall_time_s: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    settings: LinearProbeSettings,
) -> ProbeResult:
    """Fit on (train_x, train_y), score on (test_x, test_y); classes are those seen in training."""
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ConfigError(
            f"probe features must be (n, d) with one d, got {train_x.shape} and {test_x.shape}"
        )
    classes = np.unique(train_y)
    if len(classes) < 2:
        raise ConfigError("the linear probe needs at least two classes in the train split")
    start = time.monotonic()
    classifier = LogisticRegression(C=settings.C, max_iter=settings.max_iter)
    model = make_pipeline(StandardScaler(), classifier) if settings.standardize else classifier
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(train_x, train_y)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    if not converged:
        log.warning("the linear probe did not converge in %d iterations", settings.max_iter)
    n_iter = int(np.max(classifier.n_iter_))
    return ProbeResult(
        accuracy=float(np.mean(model.predict(test_x) == test_y)),
        train_accuracy=float(np.mean(model.predict(train_x) == train_y)),
        chance=1.0 / len(classes),
        n_train=len(train_y),
        n_test=len(test_y),
        n_classes=len(classes),
        n_iter=n_iter,
        converged=converged,
        wall_time_s=time.monotonic() - start,
    )
