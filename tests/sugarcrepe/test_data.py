"""Reading SugarCrepe's files, the labelled zero-shot folder, and the ``sugarcrepe`` config checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from repdiag.core.config import fill_defaults, load_config
from repdiag.core.errors import ConfigError
from repdiag.sugarcrepe.data import (
    CATEGORIES,
    check_sugarcrepe_config,
    labelled_folder,
    load_examples,
    read_category,
    scored_models,
    sugarcrepe_files,
)
from tests.sugarcrepe.fixture import make_labelled_folder, make_sugarcrepe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def fixture(tmp_path: Path):
    return make_sugarcrepe(tmp_path, n_images=6, per_category=3)


def test_examples_are_read_in_category_then_file_order(fixture) -> None:
    examples = load_examples(fixture.root, fixture.images)
    assert len(examples) == 7 * 3
    assert [e.category for e in examples] == [c for c in CATEGORIES for _ in range(3)]
    for category in CATEGORIES:
        got = [e for e in examples if e.category == category]
        assert [e.id for e in got] == ["1", "4", "7"]
        assert [(e.filename, e.caption, e.negative_caption) for e in got] == [
            (r["filename"], r["caption"], r["negative_caption"]) for r in fixture.examples[category]
        ]


def test_max_per_category_and_a_subset_of_categories(fixture) -> None:
    examples = load_examples(
        fixture.root, fixture.images, ["swap_att", "add_obj"], max_per_category=2
    )
    assert [(e.category, e.id) for e in examples] == [
        ("swap_att", "1"),
        ("swap_att", "4"),
        ("add_obj", "1"),
        ("add_obj", "4"),
    ]
    assert sugarcrepe_files(fixture.root, ["swap_att"]) == [str(fixture.root / "swap_att.json")]
    assert sugarcrepe_files(None, CATEGORIES) == []


def test_missing_data_say_what_to_download(fixture, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sugarcrepe.root is not set.*RAIVNLab/sugar-crepe"):
        load_examples(None, fixture.images)
    (fixture.root / "swap_obj.json").unlink()
    with pytest.raises(
        ConfigError, match=r"swap_obj.json does not exist.*sugar-crepe/tree/main/data"
    ):
        load_examples(fixture.root, fixture.images)
    with pytest.raises(ConfigError, match=r"sugarcrepe.images is not set.*val2017.zip"):
        load_examples(fixture.root, None, ["add_att"])
    first = fixture.examples["add_att"][0]["filename"]
    (fixture.images / first).unlink()
    with pytest.raises(ConfigError, match=rf"1 images .* not in .*val2017.*{first}.*val2017.zip"):
        load_examples(fixture.root, fixture.images, ["add_att"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"is not valid JSON"),
        ("[]", r"expected a non-empty dict keyed by example id"),
        (
            json.dumps({"7": {"filename": "a.jpg", "caption": "x"}}),
            r"example '7': needs non-empty string fields",
        ),
        (
            json.dumps({"7": {"filename": "a.jpg", "caption": "x", "negative_caption": ""}}),
            r"example '7'",
        ),
    ],
)
def test_malformed_files_name_the_file_and_example(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "replace_obj.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"{path}.*{message}|{message}") as err:
        read_category(path, "replace_obj")
    assert str(path) in str(err.value)


def test_labelled_folder_names_classes_from_folders_or_a_mapping(tmp_path: Path) -> None:
    folder = make_labelled_folder(
        tmp_path / "zs", {"n02_golden_retriever": 1, "n01_tabby_cat": 0}, per_class=3
    )
    plain = labelled_folder(folder)
    assert plain.class_dirs == ["n01_tabby_cat", "n02_golden_retriever"]
    assert plain.class_names == ["n01 tabby cat", "n02 golden retriever"]
    assert plain.labels == [0, 0, 0, 1, 1, 1]
    assert [p.name for p in plain.paths] == ["0.png", "1.png", "2.png"] * 2
    names = {"n01_tabby_cat": "tabby cat", "n02_golden_retriever": "golden retriever"}
    mapping_file = tmp_path / "names.json"
    mapping_file.write_text(json.dumps(names))
    for class_names in (names, str(mapping_file)):
        named = labelled_folder(folder, class_names, max_per_class=2)
        assert named.class_names == ["tabby cat", "golden retriever"]
        assert named.labels == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match=r"no name for 1 class folders .*n02_golden_retriever"):
        labelled_folder(folder, {"n01_tabby_cat": "tabby cat"})
    with pytest.raises(ConfigError, match=r"needs one sub-folder per class"):
        labelled_folder(folder / "n01_tabby_cat")


def _config(sugarcrepe: dict, models: dict | None = None) -> dict:
    config = {
        "models": models
        or {
            "zoo_a": {"source": "zoo", "id": "a", "family": "contrastive"},
            "clip_b": {"source": "open_clip", "id": "ViT-S-32-alt", "family": "vision_language"},
            "clip_a": {"source": "open_clip", "id": "RN50", "family": "vision_language"},
        },
        "sugarcrepe": copy.deepcopy(sugarcrepe),
    }
    return fill_defaults(config)


def test_scored_models_default_to_the_open_clip_models_in_config_order() -> None:
    assert scored_models(_config({})) == ["clip_b", "clip_a"]
    assert scored_models(_config({"models": ["clip_a"]})) == ["clip_a"]


def test_semantic_checks(fixture) -> None:
    check_sugarcrepe_config(_config({}))  # disabled: data paths are not looked at
    with pytest.raises(ConfigError, match=r"sugarcrepe.models: 'nope' is not a key of models"):
        check_sugarcrepe_config(_config({"models": ["nope"]}))
    with pytest.raises(
        ConfigError, match=r"sugarcrepe.models: 'zoo_a' has source 'zoo'.*no text tower"
    ):
        check_sugarcrepe_config(_config({"models": ["zoo_a"]}))
    zoo_only = {"zoo_a": {"source": "zoo", "id": "a", "family": "contrastive"}}
    with pytest.raises(ConfigError, match=r"enabled is true but no model has a text tower"):
        check_sugarcrepe_config(_config({"enabled": True}, zoo_only))
    with pytest.raises(ConfigError, match=r"sugarcrepe.root: None is not a folder.*sugar-crepe"):
        check_sugarcrepe_config(_config({"enabled": True}))
    enabled = {"enabled": True, "root": str(fixture.root), "images": str(fixture.images)}
    check_sugarcrepe_config(_config(enabled))
    with pytest.raises(ConfigError, match=r"sugarcrepe.images: 'nowhere' is not a folder.*val2017"):
        check_sugarcrepe_config(_config({**enabled, "images": "nowhere"}))
    with pytest.raises(ConfigError, match=r"sugarcrepe.zero_shot.folder: nowhere is not a folder"):
        check_sugarcrepe_config(_config({**enabled, "zero_shot": {"folder": "nowhere"}}))
    (fixture.root / "add_att.json").unlink()
    with pytest.raises(ConfigError, match=r"sugarcrepe.root: .* lacks add_att.json"):
        check_sugarcrepe_config(_config(enabled))
    check_sugarcrepe_config(_config({**enabled, "categories": ["add_obj"]}))


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"categories": ["replace_noun"]}, r"replace_noun"),
        ({"zero_shot": {"templates": ["a photo"]}}, r"does not match"),
        ({"headline": "mean"}, r"mean"),
        ({"batch_size": 0}, r"minimum"),
        ({"typo": 1}, r"typo"),
    ],
)
def test_the_schema_rejects_bad_values(tmp_path: Path, section: dict, message: str) -> None:
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["sugarcrepe"] = section
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_the_default_configs_validate_with_sugarcrepe_disabled() -> None:
    for name in ("config/config.yaml", "config/test.yaml"):
        config = load_config(REPO / name)
        assert config["sugarcrepe"]["enabled"] is False
        assert config["sugarcrepe"]["categories"] == list(CATEGORIES)
        assert config["sugarcrepe"]["zero_shot"]["templates"] == ["a photo of a {}."]


def test_scoring_settings_need_the_seed_resolved_and_take_the_schemas_zero_shot():
    from repdiag.sugarcrepe.data import ScoringSettings

    with pytest.raises(ConfigError, match=r"sugarcrepe\.seed is None: .*global seed"):
        ScoringSettings.from_config({})  # the schema's null, which the rule resolves
    settings = ScoringSettings.from_config({"seed": 4, "zero_shot": {"max_per_class": 2}})
    assert settings.zero_shot.templates == ("a photo of a {}.",)
    assert (settings.zero_shot.folder, settings.zero_shot.max_per_class) == (None, 2)
