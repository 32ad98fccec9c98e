"""Scoring SugarCrepe and zero-shot accuracy: oracle models (exact by construction), a random-weight
open_clip model end to end, and the same numbers from a direct per-example computation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image
from scipy.stats import binomtest

from repdiag.core.errors import ConfigError, EncoderError
from repdiag.sugarcrepe.data import (
    CATEGORIES,
    ScoringSettings,
    ZeroShotSettings,
    labelled_folder,
    load_examples,
)
from repdiag.sugarcrepe.scoring import (
    accuracy_by_category,
    build_image_text_model,
    evaluate_model,
    score_examples,
    zero_shot_accuracy,
)
from tests.sugarcrepe.fixture import caption, make_labelled_folder, make_sugarcrepe

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = pytest.mark.xdist_group("sugarcrepe/test_scoring")

CLIP = "ViT-S-32-alt"  # the smallest open_clip architecture with the bundled OpenAI BPE tokenizer
ORACLE = "tests.sugarcrepe.oracle_encoders:ColourCode"
N_IMAGES = 6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory):
    return make_sugarcrepe(tmp_path_factory.mktemp("sugarcrepe"), n_images=N_IMAGES, per_category=2)


@pytest.fixture(scope="module")
def examples(fixture):
    return load_examples(fixture.root, fixture.images)


def oracle(vocabulary: dict[str, int]):
    entry = {
        "source": "python",
        "id": ORACLE,
        "family": "other",
        "kwargs": {"vocabulary": vocabulary},
    }
    return build_image_text_model("oracle", entry, seed=0)  # a python model: the seed is unused


def test_a_model_that_prefers_the_true_caption_scores_100_percent(fixture, examples) -> None:
    model = oracle({caption(i): i for i in range(N_IMAGES)})
    scores = score_examples(model, examples, fixture.images, batch_size=4)
    np.testing.assert_allclose(scores.positive, 1.0)
    np.testing.assert_allclose(scores.negative, 0.0)
    result = accuracy_by_category(scores)
    assert list(result["categories"]) == list(CATEGORIES)
    low, high = binomtest(2, 2).proportion_ci(method="wilson")
    for category in CATEGORIES:
        record = result["categories"][category]
        assert (record["accuracy"], record["hits"], record["n"]) == (1.0, 2, 2)
        assert record["ci_low"] == pytest.approx(low) and record["ci_high"] == pytest.approx(high)
    assert (result["overall"]["accuracy"], result["overall"]["n"]) == (1.0, 14)
    assert result["overall"]["ci_low"] == pytest.approx(
        binomtest(14, 14).proportion_ci(method="wilson").low
    )
    assert result["macro"]["accuracy"] == 1.0 and result["macro"]["ci_method"] == "normal"


def test_known_partial_accuracy_ties_count_as_wrong(fixture, examples) -> None:
    """Only images 0-2 know their caption; the others tie at 0 = 0, which is not a success."""
    known = {0, 1, 2}
    scores = score_examples(oracle({caption(i): i for i in known}), examples, fixture.images, 64)
    result = accuracy_by_category(scores)
    for category in CATEGORIES:
        expected = [fixture.image_index[r["filename"]] in known for r in fixture.examples[category]]
        record = result["categories"][category]
        assert record["hits"] == sum(expected) and record["n"] == len(expected)
        low, high = binomtest(sum(expected), len(expected)).proportion_ci(method="wilson")
        assert (record["ci_low"], record["ci_high"]) == pytest.approx((low, high))
    per_category = [result["categories"][c]["accuracy"] for c in CATEGORIES]
    assert result["macro"]["accuracy"] == pytest.approx(np.mean(per_category))
    se = math.sqrt(sum(p * (1 - p) / 2 for p in per_category)) / 7
    assert result["macro"]["ci_high"] == pytest.approx(
        min(1.0, np.mean(per_category) + 1.959964 * se), abs=1e-6
    )
    hits = sum(fixture.image_index[e.filename] in known for e in examples)
    assert result["overall"]["hits"] == hits
    # every text unknown: all ties, nothing correct
    assert (
        accuracy_by_category(score_examples(oracle({}), examples, fixture.images, 64))["overall"][
            "hits"
        ]
        == 0
    )


def test_a_model_that_prefers_the_negative_scores_zero(fixture, examples) -> None:
    vocabulary = {e.negative_caption: fixture.image_index[e.filename] for e in examples}
    result = accuracy_by_category(score_examples(oracle(vocabulary), examples, fixture.images, 64))
    assert result["overall"]["accuracy"] == 0.0 and result["overall"]["ci_low"] == 0.0


def test_zero_shot_accuracy_of_oracles(tmp_path: Path) -> None:
    folder = labelled_folder(
        make_labelled_folder(tmp_path / "zs", {"ant": 3, "bee": 1, "cow": 4}, per_class=2)
    )
    templates = ["a photo of a {}.", "a drawing of a {}."]
    right = {
        t.format(name): code
        for name, code in (("ant", 3), ("bee", 1), ("cow", 4))
        for t in templates
    }
    result = zero_shot_accuracy(oracle(right), folder, templates, batch_size=4)
    assert (result["accuracy"], result["hits"], result["n"], result["n_classes"]) == (1.0, 6, 6, 3)
    # "cow" prompts point at the ant code: ant and cow images both score ant's class first
    wrong_cow = {**right, "a photo of a cow.": 3, "a drawing of a cow.": 3}
    assert zero_shot_accuracy(oracle(wrong_cow), folder, templates, 64)["hits"] == 4


@pytest.fixture(scope="module")
def clip():
    return build_image_text_model(
        "tiny", {"source": "open_clip", "id": CLIP, "family": "vision_language"}, seed=3
    )


def test_random_open_clip_scores_match_a_direct_computation(
    fixture, examples, clip, tmp_path: Path
) -> None:
    scores = score_examples(clip, examples, fixture.images, batch_size=5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        reference, _, preprocess = open_clip.create_model_and_transforms(CLIP, pretrained=None)
    reference.eval()
    for (name, ours), theirs in zip(
        clip.model.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name  # the seed fixes the random weights
    tokenizer = open_clip.get_tokenizer(CLIP)
    positive, negative = [], []
    with torch.no_grad():
        for example in examples:
            image = preprocess(Image.open(fixture.images / example.filename).convert("RGB"))[None]
            f = reference.encode_image(image, normalize=True)
            t = reference.encode_text(
                tokenizer([example.caption, example.negative_caption]), normalize=True
            )
            pos, neg = (f @ t.T)[0].tolist()
            positive.append(pos)
            negative.append(neg)
    np.testing.assert_allclose(scores.positive, positive, atol=2e-5)
    np.testing.assert_allclose(scores.negative, negative, atol=2e-5)
    assert not np.allclose(
        scores.positive, scores.negative
    )  # random weights still tell captions apart
    result = accuracy_by_category(scores)
    correct = np.array(positive) > np.array(negative)
    for category in CATEGORIES:
        rows = [e.category == category for e in examples]
        assert result["categories"][category]["hits"] == int(correct[rows].sum())
    # zero-shot: the class of highest cosine with the mean of the prompts' unit embeddings
    folder = labelled_folder(
        make_labelled_folder(tmp_path / "zs", {"ant": 0, "bee": 5}, per_class=2)
    )
    templates = ["a photo of a {}.", "a {} in the wild."]
    ours = zero_shot_accuracy(clip, folder, templates, 64)
    with torch.no_grad():
        classes = []
        for name in folder.class_names:
            t = reference.encode_text(
                tokenizer([p.format(name) for p in templates]), normalize=True
            )
            classes.append(torch.nn.functional.normalize(t.mean(0), dim=0))
        images = torch.cat([preprocess(Image.open(p).convert("RGB"))[None] for p in folder.paths])
        predicted = (
            reference.encode_image(images, normalize=True) @ torch.stack(classes).T
        ).argmax(1)
    assert ours["hits"] == int((predicted == torch.tensor(folder.labels)).sum())


def test_evaluate_model_end_to_end_with_random_open_clip(fixture, tmp_path: Path) -> None:
    entry = {
        "source": "open_clip",
        "id": CLIP,
        "family": "vision_language",
        "covariates": {"zero_shot_accuracy": 0.42},
    }
    section = {
        "root": str(fixture.root),
        "images": str(fixture.images),
        "categories": ["replace_att", "swap_obj", "add_obj"],
        "max_per_category": 1,
        "batch_size": 8,
        "seed": 0,
    }
    settings = ScoringSettings.from_config(section)
    assert settings.zero_shot == ZeroShotSettings(None, None, ("a photo of a {}.",), None)
    result = evaluate_model("tiny", entry, settings, device="cpu")
    assert list(result["categories"]) == ["replace_att", "swap_obj", "add_obj"]
    assert result["n_examples"] == result["overall"]["n"] == 3
    for record in [*result["categories"].values(), result["overall"]]:
        assert record["accuracy"] == record["hits"] / record["n"]
        assert record["ci_low"] <= record["accuracy"] <= record["ci_high"]
    assert result["zero_shot"] == {"accuracy": 0.42, "source": "config", "config_value": 0.42}
    assert result["preprocess"]["input_size"] == 224 and result["family"] == "vision_language"
    # a labelled folder takes precedence over the config's number; neither: missing
    folder = make_labelled_folder(tmp_path / "zs", {"ant": 0, "bee": 5}, per_class=1)
    with_folder = ScoringSettings.from_config(section | {"zero_shot": {"folder": str(folder)}})
    computed = evaluate_model("tiny", entry, with_folder, device="cpu")
    assert computed["zero_shot"]["source"] == "folder" and computed["zero_shot"]["n"] == 2
    assert computed["zero_shot"]["config_value"] == 0.42
    assert computed["categories"] == result["categories"]  # same seed, same weights, same scores
    entry.pop("covariates")
    missing = evaluate_model(
        "tiny",
        entry,
        settings,
        device="cpu",
        examples=load_examples(fixture.root, fixture.images, ["add_att"], 1),
    )
    assert missing["zero_shot"]["accuracy"] is None and missing["zero_shot"]["source"] == "missing"
    assert list(missing["categories"]) == ["add_att"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"source": "timm", "id": "resnet18"}, r"source 'timm' has no text tower"),
        (
            {"source": "python", "id": "tests.sugarcrepe.oracle_encoders:ImageOnly"},
            r"ImageOnly without \['encode_image', 'encode_text', 'tokenize'\]",
        ),
        ({"source": "open_clip", "id": "ViT-S-33"}, r"'ViT-S-33' is not an open_clip model"),
        (
            {"source": "open_clip", "id": "ViT-B-32", "pretrained": "openai"},
            r"not in the local cache",
        ),
        (
            {"source": "open_clip", "id": "ViT-B-32", "pretrained": "no_such_tag"},
            r"not a pretrained tag of ViT-B-32",
        ),
        (
            {"source": "open_clip", "id": "ViT-B-32", "pretrained": "/no/such.safetensors"},
            r"does not exist",
        ),
        ({"source": "python", "id": "not a target"}, r"must be 'package.module:callable'"),
    ],
)
def test_models_without_usable_towers_are_refused(entry: dict, message: str) -> None:
    with pytest.raises(EncoderError, match=rf"model 'bad': .*{message}"):
        build_image_text_model("bad", {"family": "other", **entry}, seed=0)


def test_missing_images_are_named_before_any_model_runs(fixture, examples, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sugarcrepe.images: .* is not a folder"):
        score_examples(oracle({}), examples, tmp_path / "nowhere", 64)
