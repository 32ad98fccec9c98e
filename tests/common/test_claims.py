"""The Claim type and the per-study claims files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from repdiag.common.claims import (
    MIXED,
    NOT_SUPPORTED,
    NOT_TESTED,
    SUPPORTED,
    Claim,
    load_claims,
    study_claims,
    verdict,
)
from repdiag.core.errors import ConfigError

STUDIES = ("binding", "identifiability", "alignment")


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text("study: demo\npaper: A paper\nclaims:\n" + body)
    return path


def test_a_file_loads_in_order_with_numbers_and_selection(tmp_path):
    path = write(
        tmp_path,
        "  - {id: b, statement: second, paper_text: 'r = 0.5', value: 0.5}\n"
        "  - {id: a, statement: first, paper_text: '>= 0.9', low: 0.9, where: {encoder: mlp}}\n",
    )
    claims = load_claims(path)
    assert claims.ids == ("b", "a")
    assert claims["b"].value == 0.5 and math.isnan(claims["b"].low)
    assert claims["a"].where == {"encoder": "mlp"}
    assert [c.statement for c in claims] == ["second", "first"]
    with pytest.raises(KeyError, match="no claim 'c' in the demo claims"):
        claims["c"]


def test_holds_every_value_in_the_band():
    band = Claim("x", "s", "t", low=0.05, high=0.13)
    assert band.holds([0.05, 0.1, 0.13]) is True
    assert band.holds([0.1, 0.14]) is False
    assert band.holds([0.1, math.nan]) is False  # NaN is never in a band
    assert band.holds([]) is None
    assert Claim("x", "s", "t", low=0.99).holds([1.5]) is True  # an open side is unbounded
    assert Claim("x", "s", "t", high=0.001).holds([0.01]) is False
    assert Claim("x", "s", "t", value=0.69).holds([0.69]) is None  # no band: compared by eye


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  - {id: a, statement: s, paper_text: t}\n" * 2, r"claims\[1\]: duplicate id 'a'"),
        ("  - {id: a, statement: s, paper_text: t, valu: 1}\n", "unknown key 'valu'"),
        ("  - {id: a, statement: s, paper_text: t, value: high}\n", "value must be a number"),
        ("  - {id: a, statement: s, paper_text: t, value: true}\n", "value must be a number"),
        ("  - {id: a, statement: s, paper_text: t, low: 2, high: 1}\n", "low 2.0 is above high"),
        ("  - {id: a, paper_text: t}\n", "statement is required"),
        ("  - {id: a, statement: s, paper_text: t, where: [1]}\n", "where must be a mapping"),
        ("  - just text\n", "a claim is a mapping"),
    ],
)
def test_a_bad_file_names_the_claim_and_the_key(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError, match=message) as error:
        load_claims(path)
    assert str(path) in str(error.value)


def test_a_missing_file_or_section_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_claims(tmp_path / "none.yaml")
    (tmp_path / "c.yaml").write_text("study: demo\npaper: p\n")
    with pytest.raises(ConfigError, match="a list of claims"):
        load_claims(tmp_path / "c.yaml")


def test_verdict_from_held_and_tested():
    assert verdict(0, 0) == NOT_TESTED
    assert verdict(3, 3) == SUPPORTED
    assert verdict(1, 3) == MIXED
    assert verdict(0, 3) == NOT_SUPPORTED


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_has_a_claims_file(study):
    claims = study_claims(study)
    assert claims.study == study and len(claims) >= 6
    for claim in claims:
        assert claim.statement and claim.paper_text


def test_the_papers_headline_numbers_are_in_the_files():
    binding = study_claims("binding")
    assert binding["jer_binding_r"].value == 0.69
    assert binding["jer_same_different_r2"].value == 0.78
    assert binding["jer_binding_p"].holds([0.0004]) and not binding["jer_binding_p"].holds([0.01])
    identifiability = study_claims("identifiability")
    assert (identifiability["mlp_violated"].low, identifiability["mlp_violated"].high) == (
        0.05,
        0.13,
    )
    assert study_claims("alignment")["anchoring_matches_full"].value == 0.001
