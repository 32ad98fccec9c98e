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
