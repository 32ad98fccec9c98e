"""Shared builders for the identifiability tests."""

from __future__ import annotations

import dataclasses
from typing import Any


def contrastive(**overrides: Any):
    """A :class:`~repdiag.identifiability.train.ContrastiveSettings` as the workflow builds it
    for the default grid's first cell (every value from the schema), with ``overrides``."""
    from repdiag.core.config import schema_defaults
    from repdiag.identifiability.study import cell_names, cell_params, train_settings

    section = schema_defaults("identifiability")
    base = train_settings(cell_params(section, cell_names(section)[0]))
    return dataclasses.replace(base, **overrides)


def latent_encoder(cell_kind: str = "mlp", **overrides: Any):
    """A :class:`~repdiag.identifiability.encoders.LatentEncoderSettings` as the workflow builds it
    for the default grid's first cell of encoder ``cell_kind`` on the patches generator (every value
    from the schema), with ``overrides``."""
    from repdiag.core.config import schema_defaults
    from repdiag.identifiability.encoders import LatentEncoderSettings
    from repdiag.identifiability.study import cell_names, cell_params

    section = schema_defaults("identifiability")
    cells = (cell_params(section, name) for name in cell_names(section))
    cell = next(
        c
        for c in cells
        if c["encoder"]["kind"] == cell_kind and c["generator"]["name"] == "patches"
    )
    return dataclasses.replace(LatentEncoderSettings.of(cell["encoder"]), **overrides)
