"""A paper's claims as data: one ``claims.yaml`` per study holds the paper's numbers.

Each study's report reads its file with :func:`study_claims` and evaluates every claim on the
run's tables; the paper's values are never written in code. A file is a mapping::

    study: binding
    paper: "Global geometry is not enough for vision representations"
    claims:
      - id: jer_binding_r
        statement: Pearson r(JER, binding accuracy)
        paper_text: r = 0.69
        value: 0.69

``value`` is the paper's point value, ``[low, high]`` the band a measured value must lie in for
the claim to hold, ``spread`` a reported standard deviation, ``where`` the study's selection of
the cells the claim is about (families, encoder, loss ...). Only ``id``, ``statement`` and
``paper_text`` are required.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from repdiag.core.config import load_yaml
from repdiag.core.errors import ConfigError

NAN = math.nan
PACKAGE = Path(__file__).resolve().parents[1]
FILE_NAME = "claims.yaml"
REQUIRED = ("id", "statement", "paper_text")
NUMBERS = ("value", "low", "high", "spread")
OPTIONAL = (*NUMBERS, "where")

SUPPORTED, MIXED, NOT_SUPPORTED, NOT_TESTED = "supported", "mixed", "not supported", "not tested"


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: what it says, its number as written and as a value or band."""

    claim_id: str
    statement: str
    paper_text: str
    value: float = NAN
    low: float = NAN
    high: float = NAN
    spread: float = NAN
    where: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def has_band(self) -> bool:
        return math.isfinite(self.low) or math.isfinite(self.high)

    def in_band(self, values: Iterable[float]) -> np.ndarray:
        """Per value: low <= v <= high (an open side is unbounded; NaN is never in the band)."""
        values = np.asarray(list(values), dtype=float)
        low = self.low if math.isfinite(self.low) else -np.inf
        high = self.high if math.isfinite(self.high) else np.inf
        return (values >= low) & (values <= high)

    def holds(self, values: Iterable[float]) -> bool | None:
        """True when every value lies in the band; None without a band or without values."""
        inside = self.in_band(values)
        if not self.has_band or inside.size == 0:
            return None
        return bool(inside.all())


@dataclass(frozen=True)
class ClaimSet:
    """The claims of one study's paper, by id, in the file's order."""

    study: str
    paper: str
    claims: Mapping[str, Claim]

    def __getitem__(self, claim_id: str) -> Claim:
        try:
            return self.claims[claim_id]
        except KeyError:
            known = ", ".join(self.claims)
            raise KeyError(f"no claim {claim_id!r} in the {self.study} claims ({known})") from None

    def __iter__(self) -> Iterator[Claim]:
        return iter(self.claims.values())

    def __len__(self) -> int:
        return len(self.claims)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.claims)


def verdict(held: int, tested: int) -> str:
    """``supported`` when every test held, ``not supported`` when none did, else ``mixed``;
    ``not tested`` without a test."""
    if tested == 0:
        return NOT_TESTED
    if held == tested:
        return SUPPORTED
    return MIXED if held else NOT_SUPPORTED


def _number(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry.get(key, NAN)
    if value is None:
        return NAN
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def _claim(entry: Any, where: str) -> Claim:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: a claim is a mapping with {', '.join(REQUIRED)}")
    unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (a claim has {', '.join(REQUIRED + OPTIONAL)})"
        )
    missing = [key for key in REQUIRED if not isinstance(entry.get(key), str) or not entry[key]]
    if missing:
        raise ConfigError(f"{where}: {missing[0]} is required and must be a non-empty string")
    numbers = {key: _number(entry, key, where) for key in NUMBERS}
    if numbers["low"] > numbers["high"]:
        raise ConfigError(f"{where}: low {numbers['low']} is above high {numbers['high']}")
    selection = entry.get("where", {})
    if not isinstance(selection, Mapping):
        raise ConfigError(f"{where}: where must be a mapping of the study's selection keys")
    return Claim(
        claim_id=entry["id"],
        statement=entry["statement"],
        paper_text=entry["paper_text"],
        where=MappingProxyType(dict(selection)),
        **numbers,
    )


def load_claims(path: str | Path) -> ClaimSet:
    """Read and check a claims file: known keys only, numbers as numbers, ids unique."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"claims file {path} does not exist")
    document = load_yaml(path) or {}
    if not isinstance(document, Mapping) or not isinstance(document.get("claims"), list):
        raise ConfigError(f"{path}: expected a mapping with study, paper and a list of claims")
    for key in ("study", "paper"):
        if not isinstance(document.get(key), str):
            raise ConfigError(f"{path}: {key} is required and must be a string")
    claims: dict[str, Claim] = {}
    for index, entry in enumerate(document["claims"]):
        claim = _claim(entry, f"{path}: claims[{index}]")
        if claim.claim_id in claims:
            raise ConfigError(f"{path}: claims[{index}]: duplicate id {claim.claim_id!r}")
        claims[claim.claim_id] = claim
    return ClaimSet(document["study"], document["paper"], MappingProxyType(claims))


@functools.cache
def study_claims(study: str) -> ClaimSet:
    """The claims of ``repdiag/<study>/claims.yaml``."""
    claims = load_claims(PACKAGE / study / FILE_NAME)
    if claims.study != study:
        raise ConfigError(
            f"{PACKAGE / study / FILE_NAME}: study is {claims.study!r}, not {study!r}"
        )
    return claims
