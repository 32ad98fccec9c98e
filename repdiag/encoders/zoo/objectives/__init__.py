"""Zoo objectives, one module each; importing this package registers all of them."""

from repdiag.encoders.zoo.objectives import (  # noqa: F401  (imported to register)
    barlow_twins,
    clip,
    dino,
    mae,
    simclr,
    simmim,
    supervised,
    vicreg,
)
from repdiag.encoders.zoo.objectives.base import OBJECTIVES, Batch, Objective

__all__ = ["OBJECTIVES", "Batch", "Objective"]
