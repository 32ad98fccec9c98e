"""A bad config fails before any job runs, with a message naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, copy_workflow, snakemake

TEST_CONFIG = yaml.safe_load((REPO / "config" / "test.yaml").read_text())


def mutate(path: tuple[str, ...], value: object) -> dict:
    config = copy.deepcopy(TEST_CONFIG)
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return config


BAD_CONFIGS = {
    "string n_candidates": (
        mutate(("datasets", "binding", "n_candidates"), "eight"),
        "n_candidates",
    ),
    "unknown top-level key": ({**TEST_CONFIG, "n_candidate": 8}, "n_candidate"),
    "unknown dataset key": (mutate(("datasets", "binding", "colour_mode"), "x"), "colour_mode"),
    "unknown source": (mutate(("models", "mae", "source"), "tensorflow"), "tensorflow"),
    "unknown family": (mutate(("models", "mae", "family"), "generative"), "generative"),
    "shell metacharacters in a model key": (
        {**TEST_CONFIG, "models": {"a;rm -rf ~": TEST_CONFIG["models"]["mae"]}},
        "a;rm -rf ~",
    ),
    "bad device": ({**TEST_CONFIG, "device": "tpu"}, "tpu"),
    "negative seed": ({**TEST_CONFIG, "seed": -1}, "-1"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("badconfig"))


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_fails_before_any_job_naming_the_key(workdir: Path, case: str) -> None:
    config, key = BAD_CONFIGS[case]
    path = workdir / "config" / f"bad_{abs(hash(case))}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = snakemake(workdir, "-n", "--configfile", str(path), check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    assert key in output, output[-3000:]
    assert not (workdir / "results").exists()
