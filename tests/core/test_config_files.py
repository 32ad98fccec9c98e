"""Two config files that define one named entry are refused (repdiag.core.config_files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repdiag.core.config_files import check_repeated_entries, named_entry_maps
from repdiag.core.errors import ConfigError


def test_the_named_entry_maps_come_from_the_schema() -> None:
    assert {"models", "zoo.backbones", "zoo.objectives"} <= set(named_entry_maps())
    assert "embeddings" not in named_entry_maps()  # a section: files merge it key by key


def test_one_entry_in_two_files_is_refused_naming_both(tmp_path: Path) -> None:
    first, second, third = (tmp_path / f"{n}.yaml" for n in ("a", "b", "c"))
    first.write_text("models:\n  m: {source: zoo, id: m, family: x}\nembeddings: {batch_size: 4}\n")
    second.write_text(
        "models:\n  n: {source: zoo, id: n, family: x}\nembeddings: {batch_size: 8}\n"
    )
    third.write_text("zoo:\n  backbones:\n    vit: {}\nmodels:\n  m: {pooling: mean}\n")
    check_repeated_entries([first, second])  # different models, one section: fine
    with pytest.raises(ConfigError) as err:
        check_repeated_entries([first, second, third])
    assert str(err.value).startswith(
        f"models.m is defined in two config files, {first} and {third}"
    )
    check_repeated_entries([first, first])  # one file named twice is one definition


def test_the_files_snakemake_merges_include_the_workflows_own_unless_replaced():
    """Before: only the --configfile files were checked, so an entry of config/config.yaml and
    of a --configfile merged silently under a profile that does not replace the workflow's."""
    from repdiag.core.config_files import merged_config_files

    own = ["config/config.yaml"]
    assert merged_config_files(own, ["mine.yaml"], replaced=False) == [
        "config/config.yaml",
        "mine.yaml",
    ]
    assert merged_config_files(own, ["mine.yaml"], replaced=True) == ["mine.yaml"]
    assert merged_config_files(own, [], replaced=True) == ["config/config.yaml"]
    assert merged_config_files(own, ["config/config.yaml"], replaced=False) == [
        "config/config.yaml"
    ]
