"""The SugarCrepe tables across models, the partial correlation given zero-shot accuracy, the
join into the models table and the figure (no torch)."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.common.figures import save_figure
from repdiag.common.intervals import wilson_interval
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import write_json
from repdiag.sugarcrepe.data import CATEGORIES
from repdiag.sugarcrepe.report import (
    TABLE_COLUMNS,
    join_models,
    partial_correlations,
    read_result,
    sugarcrepe_figure,
    sugarcrepe_table,
)

OPTIONS = {"n_boot": 200, "seed": 0, "confidence": 0.95, "min_models": 4}
CONTRACT_COLUMNS = ["model", "category", "accuracy", "ci_low", "ci_high", "n", "zero_shot_accuracy"]


def record(hits: int, n: int) -> dict:
    low, high = wilson_interval(hits, n)
    return {
        "accuracy": hits / n,
        "ci_low": low,
        "ci_high": high,
        "n": n,
        "hits": hits,
        "ci_method": "wilson",
    }


def fake_result(
    model: str, accuracies: dict[str, float], zero_shot: float | None, n: int = 200
) -> dict:
    categories = {c: record(round(a * n), n) for c, a in accuracies.items()}
    hits = sum(r["hits"] for r in categories.values())
    return {
        "model": model,
        "family": "vision_language",
        "categories": categories,
        "overall": record(hits, n * len(categories)),
        "macro": record(hits, n * len(categories)) | {"ci_method": "normal"},
        "zero_shot": {
            "accuracy": zero_shot,
            "source": "config" if zero_shot is not None else "missing",
        },
    }


@pytest.fixture()
def models():
    """Seven models: accuracy = 0.5 + 0.01 JER + 0.3 zero-shot + noise, JER independent of zero-shot."""
    rng = np.random.default_rng(1)
    jer = rng.uniform(5, 25, 7)
    zero_shot = rng.uniform(0.2, 0.7, 7)
    results = []
    for i in range(7):
        base = 0.3 + 0.01 * jer[i] + 0.3 * zero_shot[i]
        accuracies = {c: float(np.clip(base + rng.normal(0, 0.03), 0, 1)) for c in CATEGORIES}
        results.append(fake_result(f"clip{i}", accuracies, float(zero_shot[i])))
    return results, {f"clip{i}": float(jer[i]) for i in range(7)}


def test_table_rows_and_columns(models) -> None:
    results, jer = models
    table = sugarcrepe_table(results, jer)
    assert list(table.columns) == TABLE_COLUMNS and TABLE_COLUMNS[:7] == CONTRACT_COLUMNS
    assert len(table) == 7 * (len(CATEGORIES) + 2)
    first = table[table["model"] == "clip0"]
    assert list(first["category"]) == [*CATEGORIES, "macro", "overall"]
    row = first.set_index("category").loc["swap_att"]
    assert row["accuracy"] == results[0]["categories"]["swap_att"]["accuracy"]
    assert (
        row["jer"] == jer["clip0"]
        and row["zero_shot_accuracy"] == results[0]["zero_shot"]["accuracy"]
    )


def test_no_results_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no model was scored; list image-text models"):
        sugarcrepe_table([], {})


def test_partial_correlation_matches_an_independent_computation(models) -> None:
    results, jer = models
    table = sugarcrepe_table(results, jer)
    partial = partial_correlations(table, **OPTIONS)
    assert list(partial["category"].unique()) == ["macro", "overall", *CATEGORIES]
    macro = table[table["category"] == "macro"]
    x, y, z = (macro[c].to_numpy(float) for c in ("jer", "accuracy", "zero_shot_accuracy"))
    residual = lambda v: v - np.polyval(np.polyfit(z, v, 1), z)  # noqa: E731
    r = np.corrcoef(residual(x), residual(y))[0, 1]
    t = r * np.sqrt((7 - 3) / (1 - r * r))
    rows = partial[partial["category"] == "macro"].set_index("controls")
    assert rows.loc["zero_shot_accuracy", "r"] == pytest.approx(r)
    assert rows.loc["zero_shot_accuracy", "p"] == pytest.approx(2 * sps.t.sf(abs(t), 4))
    assert rows.loc["zero_shot_accuracy", "dof"] == 4
    assert rows.loc["", "r"] == pytest.approx(sps.pearsonr(x, y).statistic)
    assert rows.loc["", "p"] == pytest.approx(sps.pearsonr(x, y).pvalue)
    assert (
        rows.loc["zero_shot_accuracy", "ci_low"] <= r <= rows.loc["zero_shot_accuracy", "ci_high"]
    )


def test_zero_shot_from_a_folder_wins_over_the_config_which_wins_over_nothing(models) -> None:
    results, jer = models
    computed = results[0] | {"zero_shot": {"accuracy": 0.61, "source": "folder"}}
    recorded = results[1] | {"zero_shot": {"accuracy": 0.33, "source": "config"}}
    unknown = results[2] | {"zero_shot": {"accuracy": None, "source": "missing"}}
    configured = {"clip0": 0.2, "clip1": 0.25, "clip2": None}
    table = sugarcrepe_table([computed, recorded, unknown], jer, configured)
    first = table.groupby("model")[["zero_shot_accuracy", "zero_shot_source"]].first()
    assert first.loc["clip0"].tolist() == [0.61, "folder"]
    assert first.loc["clip1"].tolist() == [0.25, "config"]
    assert np.isnan(first.loc["clip2", "zero_shot_accuracy"])
    assert first.loc["clip2", "zero_shot_source"] == "missing"
    assert sugarcrepe_table([recorded], jer).iloc[0]["zero_shot_accuracy"] == 0.33


def test_missing_zero_shot_and_too_few_models_leave_notes(models) -> None:
    results, jer = models
    no_zero_shot = [r | {"zero_shot": {"accuracy": None, "source": "missing"}} for r in results]
    partial = partial_correlations(sugarcrepe_table(no_zero_shot, jer), **OPTIONS)
    controlled = partial[partial["controls"] == "zero_shot_accuracy"]
    assert (
        controlled["r"].isna().all()
        and controlled["note"].str.contains("no zero-shot accuracy").all()
    )
    assert (
        partial.loc[partial["controls"] == "", "r"].notna().all()
    )  # the plain r needs no covariate
    few = partial_correlations(sugarcrepe_table(results[:4], jer), **OPTIONS)
    assert (
        few.loc[few["controls"] == "zero_shot_accuracy", "note"]
        .str.contains("too few models")
        .all()
    )


def test_read_result_names_a_missing_or_foreign_file(tmp_path) -> None:
    with pytest.raises(StoreError, match=r"does not exist: run rule sugarcrepe_score"):
        read_result(tmp_path / "a.json")
    write_json(tmp_path / "b.json", {"model": "b"})
    with pytest.raises(StoreError, match=r"b.json lacks \['family', 'categories'"):
        read_result(tmp_path / "b.json")


def test_join_adds_sugarcrepe_columns_and_leaves_unscored_models_empty(models) -> None:
    results, jer = models
    table = sugarcrepe_table(results[:2], jer)
    base = pd.DataFrame({"model": ["zoo", "clip1", "clip0"], "jer": [1.0, 2.0, 3.0]})
    joined = join_models(base, table, "swap_obj").set_index("model")
    assert list(joined.columns[:1]) == ["jer"] and (joined["jer"].to_numpy() == [1, 2, 3]).all()
    assert joined.loc["clip1", "sugarcrepe"] == results[1]["categories"]["swap_obj"]["accuracy"]
    assert (
        joined.loc["clip1", "sugarcrepe_ci_low"] == results[1]["categories"]["swap_obj"]["ci_low"]
    )
    assert joined.loc["clip0", "sugarcrepe_macro"] == results[0]["macro"]["accuracy"]
    assert joined.loc["clip0", "sugarcrepe_zero_shot"] == results[0]["zero_shot"]["accuracy"]
    assert joined.loc["zoo"].filter(like="sugarcrepe").isna().all()
    with pytest.raises(
        StoreError, match=r"already has SugarCrepe columns \['sugarcrepe', 'sugarcrepe_ci_low'"
    ):
        join_models(joined.reset_index(), table, "macro")


@pytest.mark.parametrize("n_models", [7, 3])
def test_figure_is_written_as_png_and_pdf(models, tmp_path, n_models: int) -> None:
    results, jer = models
    results = [*results[: n_models - 1], results[-1] | {"zero_shot": {"accuracy": None}}]
    table = sugarcrepe_table(results, jer)
    figure = sugarcrepe_figure(
        table, partial_correlations(table, **OPTIONS), "macro", "JER pr (final)"
    )
    texts = [ax.get_title() for ax in figure.axes]
    assert any(t.startswith("r = ") or t.startswith("r: n/a") for t in texts)
    assert figure.axes[0].get_xlabel() == "JER pr (final) (effective rank, directions)"
    save_figure(figure, tmp_path / "f.png", tmp_path / "f.pdf")
    image = mpimg.imread(tmp_path / "f.png")
    assert image.shape[:2] == (660, 1500) and image[..., :3].std() > 0.05
    assert (tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"
