"""The binding study's final outputs, from the config alone: every main-study model's files, the
zoo's runs, the tables and figures; the on-request targets empty until a series is named."""

from __future__ import annotations

from repdiag.binding.outputs import (
    TABLES,
    binding_models,
    final_outputs,
    main_outputs,
    zoo_runs_of,
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


def test_zoo_runs_are_counted_once_per_run() -> None:
    models = {
        "a": {"source": "zoo", "id": "run1"},
        "b": {"source": "zoo", "id": "run1"},
        "c": {"source": "zoo", "id": "run0"},
        "d": {"source": "timm", "name": "resnet18"},
    }
    assert zoo_runs_of(models) == ["run0", "run1"]


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
        len(outputs["binding_families"]) == len(TABLES) + 4
    )  # + primary, scatter png/pdf, summary
