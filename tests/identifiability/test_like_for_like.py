"""The like-for-like check: its cells, the authors' runs, and claims read as distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from repdiag.core.config import load_config
from repdiag.identifiability.like_for_like import (
    authors_runs,
    check_markdown,
    distribution_claim,
    distribution_claims,
    seed_table,
    z1_lost,
)
from repdiag.identifiability.report import EXPECTED_VIOLATED
from repdiag.identifiability.study import cell_names, cell_params, check_section

REPO = Path(__file__).resolve().parents[2]


def section_of(*paths: str) -> dict:
    """The identifiability section of config files layered like ``--configfile A B``."""
    config = load_config(REPO / paths[0])
    for path in paths[1:]:
        overlay = yaml.safe_load((REPO / path).read_text())["identifiability"]
        for key, value in overlay.items():
            base = config["identifiability"].get(key)
            config["identifiability"][key] = (
                {**base, **value} if isinstance(value, dict) and isinstance(base, dict) else value
            )
    return config["identifiability"]


def test_the_default_check_builds_only_the_named_cells() -> None:
    section = section_of("config/config.yaml")
    names = cell_names(check_section(section))
    assert len(names) == 15
    assert {n.split("-")[0] for n in names} == {"identity", "linear", "invertible_mlp"}
    assert all("-restricted-mlp-infonce-s" in n for n in names)
    assert sorted({int(n.rsplit("-s", 1)[1]) for n in names}) == [0, 1, 2, 3, 4]
    params = cell_params(check_section(section), names[0])
    assert params["train"]["batch_size"] == 2000 and params["loss"]["n_negatives"] == 2000
    assert params["train"]["steps"] == 1000
    # the grid's own settings are untouched: the check is its own set of cells
    assert section["train"]["batch_size"] == 256 and len(cell_names(section)) == 69


def test_the_paper_config_is_the_authors_setting() -> None:
    section = section_of("config/config.yaml", "config/identifiability_paper.yaml")
    assert section["train"] | {"log_every": 0} == {
        "steps": 5000,
        "batch_size": 2000,
        "log_every": 0,
    }
    assert section["loss"]["n_negatives"] == 2000 and section["grid"]["seeds"] == [0, 1, 2, 3, 4]
    check = check_section(section)
    assert check["train"]["steps"] == 5000 and len(cell_names(check)) == 25
    assert section["train"]["batch_size"] % section["loss"]["group_size"] == 0


def test_the_authors_runs_reproduce_their_stored_means() -> None:
    runs = authors_runs()
    assert runs.groupby("generator").size().to_dict() == dict.fromkeys(EXPECTED_VIOLATED, 5)
    means = runs.groupby("generator")["r2"].mean()
    for generator, (expected, _) in EXPECTED_VIOLATED.items():
        assert means[generator] == pytest.approx(expected, abs=5e-3), (
            generator
        )  # claims.yaml rounds
    assert (runs["final_loss"].between(5.70, 6.07)).all()


def cells(r2: list[float], r2_z1: list[float], generator: str = "identity") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "generator": generator,
            "sampling": "restricted",
            "encoder": "mlp",
            "loss": "infonce",
            "seed": range(len(r2)),
            "r2": r2,
            "r2_z1": r2_z1,
            "steps": 1000,
            "batch_size": 2000,
            "final_loss": 5.71,
        }
    )


AUTHORS = pd.DataFrame(
    {
        "generator": "identity",
        "run": range(5),
        "r2": [0.05, 0.12, 0.06, 0.05, 0.04],
        "final_loss": 5.7,
    }
)


@pytest.mark.parametrize(
    ("r2_z1", "lost"),
    [
        ([0.1, 0.2, 0.05, 0.3, 0.0], 5),  # every seed lost z1
        ([0.99, 0.98, 0.97, 0.995, 0.9], 0),  # every seed kept it
        ([0.99, 0.1, 0.98, 0.05, 0.2], 3),  # a seed lottery
    ],
)
def test_z1_lost_counts_seeds_below_the_threshold(r2_z1, lost) -> None:
    claims = distribution_claims(cells([0.1] * 5, r2_z1), AUTHORS).iloc[0]
    assert claims["z1_lost_seeds"] == lost == int(z1_lost(r2_z1).sum())
    assert claims["z1_lost_fraction"] == pytest.approx(lost / 5)


def test_distributions_agree_when_alike_and_differ_when_apart() -> None:
    same = distribution_claim([0.05, 0.12, 0.06, 0.05, 0.04], [0.05, 0.12, 0.06, 0.05, 0.04])
    assert same["agree"] and same["p_value"] == pytest.approx(1.0)
    apart = distribution_claim([0.30, 0.31, 0.33, 0.28, 0.29], [0.05, 0.12, 0.06, 0.05, 0.04])
    # exact U test, 5 v 5, complete separation: p = 2 / C(10, 5) = 2 / 252
    assert apart["p_value"] == pytest.approx(2 / 252) and apart["agree"] is False
    assert apart["ours_median"] == pytest.approx(0.30) and apart["authors_max"] == 0.12
    mixed = distribution_claim([0.33, 0.07, 0.01, 0.33, 0.02], [0.05, 0.12, 0.06, 0.05, 0.04])
    assert mixed["agree"] and 0.05 < mixed["p_value"] < 1.0
    nothing = distribution_claim([0.1], [])
    assert nothing["agree"] is None and np.isnan(nothing["p_value"])


def test_seed_table_sets_each_seed_beside_an_authors_run() -> None:
    table = seed_table(cells([0.3, 0.1], [0.99, 0.2]), AUTHORS)
    assert table[["seed", "authors_run"]].values.tolist() == [[0, 0], [1, 1]]
    assert table["authors_r2"].tolist() == [0.05, 0.12]
    assert table["z1_lost"].tolist() == [False, True]
    text = check_markdown(table, distribution_claims(cells([0.3, 0.1], [0.99, 0.2]), AUTHORS))
    assert "1/2" in text and "Mann-Whitney" in text
