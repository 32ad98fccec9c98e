"""The binding study's final outputs, from the config alone: every main-study model's files, the
zoo's runs, the tables and figures; the on-request targets empty until a series is named."""

from __future__ import annotations

from repdiag.binding.outputs import (
    TABLES,
    binding_models,
    final_outputs,
    main_outputs,
)
from tests.binding.test_family_options import raw_test_config, resolved
from tests.planning import resolved_config

TEST_MODELS = ["barlow_twins", "mae", "simclr", "clip", "supervised", "dose"]


def test_the_main_study_lists_each_model_stage_and_table_once() -> None:
    paths = main_outputs(resolved_config())
    assert len(paths) == len(set(paths))
    for key in TEST_MODELS:
        for path in (
            f"results/embeddings/{key}.zarr",
            f"results/jacobians/{key}.zarr",
            f"results/jacobians/{key}.json",
            f"results/metrics/{key}.json",
            # test.yaml names each run after its model; dose is step 2 its run saved
            f"results/zoo/{'dose-step2' if key == 'dose' else key}/meta.json",
        ):
            assert path in paths
    assert {p for p in paths if p.startswith("results/tables/")} == {
        f"results/tables/{name}" for name in TABLES
    }
    # 6 models x 4 files, 6 runs, the benchmark and its sheet, the tables, 6 figures x 2, summary
    assert len(paths) == 6 * 4 + 6 + 2 + len(TABLES) + 6 * 2 + 1


def test_without_zoo_models_there_is_no_zoo_run_and_no_curve() -> None:
    config = resolved_config()
    config["models"] = {"random": {"source": "timm", "name": "resnet18", "pretrained": False}}
    paths = main_outputs(config)
    assert not [p for p in paths if "zoo" in p]
    assert "results/metrics/random.json" in paths


def test_the_on_request_targets_are_empty_until_their_series_are_named() -> None:
    outputs = final_outputs(resolved_config())
    assert outputs["binding_causal"] == [] and outputs["binding_families"] == []


def test_on_request_models_leave_the_main_study_and_fill_their_own_targets() -> None:
    config = resolved(raw_test_config())
    outputs = final_outputs(config)
    main = set(binding_models(config))
    assert main == set(TEST_MODELS)  # the regularised arms and the family runs are not in it
    assert set(config["models"]) - main  # ... though the config defines them
    assert not any(
        f"/{key}." in path for key in set(config["models"]) - main for path in outputs["binding"]
    )
    assert "results/binding_causal/summary.md" in outputs["binding_causal"]
    assert "results/binding_families/correlations.csv" in outputs["binding_families"]
    assert (
        len(outputs["binding_families"]) == len(TABLES) + 5
    )  # + primary, within_run, scatter png/pdf, summary


def test_every_aggregate_reads_the_stats_keys_its_table_uses_and_a_target_its_own_score() -> None:
    """The family comparison's models.csv takes binding_families.binding_score as its
    ``binding`` column, as its tables do (they once disagreed: accuracy in the table, win rate
    in its label)."""
    from repdiag.binding.outputs import AGGREGATE_STATS_KEYS, aggregate_models, aggregate_stats

    config = resolved_config()
    assert set(aggregate_stats(config)) == set(AGGREGATE_STATS_KEYS)
    assert aggregate_stats(config)["binding_score"] == config["stats"]["binding_score"]
    families = aggregate_stats(config, config["binding_families"]["binding_score"])
    assert families["binding_score"] == "win_rate" != config["stats"]["binding_score"]
    key = next(iter(config["models"]))
    entry = config["models"][key]
    assert aggregate_models(config, [key]) == {
        key: {"family": entry["family"], "source": entry["source"],
              "covariates": entry.get("covariates", {})}
    }  # fmt: skip


def test_the_family_target_reads_one_stats_section_with_its_own_score() -> None:
    """Its tables, summary and scatter all take family_stats: the main study's stats section
    with binding_families.binding_score as the headline (the summary once labelled the win rate
    'accuracy', from the main study's section)."""
    from repdiag.binding.outputs import family_stats

    config = resolved_config()
    stats = family_stats(config)
    assert stats["binding_score"] == config["binding_families"]["binding_score"] == "win_rate"
    assert {k: v for k, v in stats.items() if k != "binding_score"} == {
        k: v for k, v in config["stats"].items() if k != "binding_score"
    }
    assert config["stats"]["binding_score"] == "accuracy"  # the main study's, untouched
