"""repdiag: what a vision representation encodes beyond its global geometry.

In a notebook (:mod:`repdiag.api`, imported on first use so that ``import repdiag`` stays light)::

    config = repdiag.load_config("config/config.yaml")
    bench = repdiag.render_benchmark("work/binding.zarr", config)
    scores = repdiag.measure(repdiag.encoder(my_module), bench, "work", config)
"""

from __future__ import annotations

import importlib
from typing import Any

from repdiag.core.version import __version__ as __version__

API = ("encoder", "jacobian_spectra", "load_config", "measure", "render_benchmark")
"""The notebook face, :mod:`repdiag.api`."""


def __getattr__(name: str) -> Any:
    if name in API:
        return getattr(importlib.import_module("repdiag.api"), name)
    raise AttributeError(f"module 'repdiag' has no attribute {name!r}")
