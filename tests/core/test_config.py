"""Reading config files: duplicate keys are errors; local paths a config names must exist."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from repdiag.core.config import UniqueKeyLoader, check_config_files, load_config, load_yaml
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


SHIPPED = sorted((REPO / "config").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_read_as_with_safe_load(path: Path) -> None:
    assert load_yaml(path) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "seed: 0\nmodels:\n  mae: {id: a}\n  clip: {id: b}\n  mae: {id: c}\n",
            r"line 5: duplicate key 'mae' in models \(first on line 3\)",
        ),
        (
            "seed: 0\nseed: 1\n",
            r"line 2: duplicate key 'seed' at the top level \(first on line 1\)",
        ),
        (
            "stats: {n_bootstrap: 100, n_bootstrap: 200}\n",
            r"line 1: duplicate key 'n_bootstrap' in stats",
        ),
        (
            "alignment:\n  real:\n    pairs:\n      - {a: x, b: y}\n      - {a: x, a: z}\n",
            r"line 5: duplicate key 'a' in alignment.real.pairs\[1\]",
        ),
        ("grid: {1: a, 1: b}\n", r"duplicate key 1 in grid"),
    ],
)
def test_a_key_given_twice_is_an_error_naming_file_line_and_mapping(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_yaml(path)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match=message):
        check_config_files([path])


def test_merge_keys_may_override_and_aliases_are_walked_once(tmp_path: Path) -> None:
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\nagain: *b\n"
    path = write(tmp_path, text)
    assert (
        load_yaml(path)
        == yaml.safe_load(text)
        == {
            "base": {"x": 1, "y": 2},
            "other": {"x": 3, "y": 2},
            "again": {"x": 1, "y": 2},
        }
    )


def test_the_loader_stays_safe(tmp_path: Path) -> None:
    path = write(tmp_path, "x: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ConfigError, match=r"line 1: key x has the YAML tag .*python/object"):
        load_yaml(path)
    assert issubclass(UniqueKeyLoader, yaml.constructor.SafeConstructor)
    assert not issubclass(UniqueKeyLoader, yaml.constructor.UnsafeConstructor)


def test_load_config_rejects_a_duplicate_model(tmp_path: Path) -> None:
    text = (
        (REPO / "config" / "test.yaml")
        .read_text()
        .replace(
            "models:\n", "models:\n  mae: {source: zoo, id: mae, family: masked_modeling}\n", 1
        )
    )
    with pytest.raises(ConfigError, match="duplicate key 'mae' in models"):
        load_config(write(tmp_path, text))


def test_check_config_files_skips_missing_and_non_yaml_files(tmp_path: Path) -> None:
    json_with_tab = tmp_path / "c.json"
    json_with_tab.write_text('{"seed":\t0}')  # JSON, but a tab YAML refuses
    check_config_files([tmp_path / "absent.yaml", json_with_tab, *SHIPPED])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"stats": {"confidence": float("nan")}}, r"stats\.confidence: nan is not a finite number"),
        ({"zoo": {"objectives": {"a": {"lr": float("-inf")}}}}, r"zoo\.objectives\.a\.lr: -inf"),
        ({"a": [1.0, {"b": float("inf")}]}, r"a\[1\]\.b: inf is not a finite number"),
        ({"seed": 2**63}, r"seed: seed 9223372036854775808 is outside \[0, 2\^63\)"),
        ({"x": {"seeds": [0, -1]}}, r"x\.seeds\[1\]: seed -1 is outside"),
    ],
)
def test_numbers_are_finite_and_seeds_fit_64_bits(edit, message):
    from repdiag.core.config import check_numbers

    with pytest.raises(ConfigError, match=message):
        check_numbers(edit)


def test_finite_numbers_and_64_bit_seeds_pass():
    from repdiag.core.config import check_numbers

    check_numbers({"seed": 2**63 - 1, "seeds": [0, 1], "lr": 1e-3, "n": None, "flag": True})


def test_an_unknown_key_gets_did_you_mean(tmp_path) -> None:
    from repdiag.core.config import load_config

    path = tmp_path / "typo.yaml"
    path.write_text("datasets: {binding: {}}\nmodels: {}\nstast: {n_bootstrap: 200}\n")
    with pytest.raises(ConfigError, match=r"'stast': did you mean 'stats'") as error:
        load_config(path)
    assert "allowed: alignment, binding_causal" in str(error.value) and str(path) in str(
        error.value
    )


def test_a_config_path_that_is_not_a_regular_file_says_so(tmp_path: Path) -> None:
    import os

    from repdiag.core.config import load_config
    from repdiag.core.errors import ConfigError

    os.mkfifo(tmp_path / "pipe.yaml")
    for path in (tmp_path / "pipe.yaml", tmp_path):  # a FIFO (never opened: no hang), a folder
        with pytest.raises(
            ConfigError, match=r"is not a regular file \(a folder, FIFO or device\)"
        ):
            load_config(path)
    with pytest.raises(ConfigError, match=r"gone\.yaml does not exist"):
        load_config(tmp_path / "gone.yaml")
