"""Config files read as a user expects: every error of `repdiag validate` is one line naming the
file and key, and two ``--configfile`` files that define one model are refused, naming both."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.cli import main
from tests.conftest import REPO, copy_workflow, plan_in_process

TEST_YAML = (REPO / "config" / "test.yaml").read_text()


def _validate(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    """`repdiag validate --no-weights PATH` in process: its stderr, after checking it failed."""
    assert main(["validate", "--no-weights", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repdiag: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("seed: !!python/object/apply:os.getcwd []\n", ["line 1", "key seed", "python/object"]),
        (TEST_YAML.replace("seed: 0", "seed: !!python/name:os.system"), ["key seed"]),
        (
            TEST_YAML.replace("family: contrastive}", "family: !custom contrastive}"),
            ["key models.simclr.family", "'!custom'"],
        ),
        ("models: [1\nseed: 2\n", ["neither YAML", "line 1"]),
    ],
    ids=["python-tag-top", "python-name-tag", "custom-tag-in-model", "unparsable"],
)
def test_a_bad_yaml_file_is_one_line_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: list[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    err = _validate(capsys, path)
    assert str(path) in err
    for part in named:
        assert part in err, err


def test_a_python_tag_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "bad.yaml"
    path.write_text(f"seed: !!python/object/apply:os.mkdir [{str(marker)!r}]\n")
    _validate(capsys, path)
    assert not marker.exists()


def test_an_unreadable_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00seed: 1\n")
    assert str(binary) in _validate(capsys, binary)
    assert "is not a regular file" in _validate(capsys, tmp_path)  # a folder, not a file
    assert "does not exist" in _validate(capsys, tmp_path / "gone.yaml")


@pytest.fixture(scope="module")
def workflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("files") / "run")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("models:\n  simclr: {source: zoo, id: simclr, family: contrastive, pooling: mean}\n",
         "models.simclr"),
        ("zoo:\n  objectives:\n    simclr: {steps: 3}\n", "zoo.objectives.simclr"),
    ],
    ids=["model", "zoo-run"],
)  # fmt: skip
def test_two_config_files_defining_one_entry_are_refused_naming_both(
    workflow: Path, extra: str, where: str
) -> None:
    second = workflow / "config" / f"extra_{where.replace('.', '_')}.yaml"
    second.write_text(extra)
    error = plan_in_process(workflow, workflow / "config" / "test.yaml", second)
    assert error is not None
    assert f"{where} is defined in two config files" in error
    assert str(workflow / "config" / "test.yaml") in error and str(second) in error


def test_two_config_files_with_different_models_still_merge(workflow: Path) -> None:
    second = workflow / "config" / "more.yaml"
    second.write_text(
        "models:\n  simclr_mean: {source: zoo, id: simclr, family: contrastive, pooling: mean}\n"
        "embeddings:\n  batch_size: 8\n"
    )
    assert plan_in_process(workflow, workflow / "config" / "test.yaml", second) is None
