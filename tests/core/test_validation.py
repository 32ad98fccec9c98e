"""repdiag.core.validation against snakemake.utils.validate: the same defaults, the same errors."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from repdiag.core.config import SCHEMA, ConfigError, load_config
from repdiag.core.validation import validate_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").glob("*.yaml"))


def snakemake_validated(config: dict) -> dict:
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, str(SCHEMA))
    return config


def as_run(name: str) -> dict:
    """The config a run with ``--configfile name`` validates: config/config.yaml updated by the file."""
    from snakemake.utils import update_config

    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / name).read_text()))
    return config


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_gets_snakemakes_defaults(name: str) -> None:
    raw = as_run(name)
    ours = copy.deepcopy(raw)
    validate_config(ours)
    assert ours == snakemake_validated(raw)
    assert ours != raw  # defaults were set


def test_the_cached_schema_is_left_as_parsed() -> None:
    from repdiag.core.config import schema_file

    before = copy.deepcopy(schema_file(SCHEMA.resolve()))
    config = as_run("config/config.yaml")
    del config["seed"]  # a top-level default, set by validation
    validate_config(config)
    assert config["seed"] == 0
    assert schema_file(SCHEMA.resolve()) == before  # no $id, no defaults written into it


@pytest.mark.parametrize(
    "patch",
    [
        {"jacobians": {"k": 0}},  # a minimum, in a $ref'd section file
        {"jacobians": {"method": "fastest"}},  # an enum
        {"unknown_section": {}},  # additionalProperties: false at the top
        {"metrics": {"readouts": {"knn": {"k": "ten"}}}},  # a type, three files deep
    ],
)
def test_errors_are_snakemakes_errors(patch: dict) -> None:
    with pytest.raises(jsonschema.ValidationError) as ours:
        validate_config(copy.deepcopy(patch))
    with pytest.raises(Exception) as theirs:
        snakemake_validated(patch)
    cause = theirs.value if hasattr(theirs.value, "absolute_path") else theirs.value.__context__
    assert (ours.value.message, list(ours.value.absolute_path)) == (
        cause.message,
        list(cause.absolute_path),
    )


def test_load_config_names_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("jacobians: {k: 0}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*\['jacobians'\]\['k'\]"):
        load_config(bad)


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"jacobians": {"k": 32.0}}, "jacobians.k"),  # in a $ref'd section file
        ({"metrics": {"readouts": {"knn": {"k": 10.0}}}}, "metrics.readouts.knn.k"),  # 3 deep
        ({"seed": 1.0}, "seed"),  # at the top
    ],
)
def test_an_integer_key_takes_an_int_not_an_integral_float(
    tmp_path: Path, patch: dict, key: str
) -> None:
    """JSON Schema (and snakemake.utils.validate) admit 32.0 as an integer; here it is an error
    naming the key, so no reader needs to convert the value again."""
    from snakemake.utils import update_config

    config = as_run("config/config.yaml")
    update_config(config, patch)
    path = tmp_path / "float.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError, match=rf"config key {re.escape(key)} .*is not of type 'integer'"
    ):
        load_config(path)
    snakemake_validated(config)  # Snakemake's own validation lets it through
