"""A bad config fails before any job runs, with a message naming the key.

Each case of :data:`BAD_CONFIGS` is a config (a mutated ``config/test.yaml``, or raw YAML text
where a dict cannot hold the mistake, like a key given twice) and the text the error must show:
the dotted key, the JSON-schema instance path or the offending value. Every case runs the real
workflow (not a dry run) on one copy of it and must leave no results directory and start no job.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from repdiag.sugarcrepe.data import CATEGORIES
from tests.conftest import REPO, copy_workflow, plan_in_process, snakemake

TEST_YAML = (REPO / "config" / "test.yaml").read_text()
TEST_CONFIG = yaml.safe_load(TEST_YAML)
DELETE = object()

# Paths below are relative to the workflow copy; none of the "missing" ones exist there.
SUGARCREPE_ROOT = "data/sugarcrepe"  # holds empty <category>.json files (see the workdir fixture)
OPEN_CLIP = {"source": "open_clip", "id": "ViT-B-32", "family": "vision_language"}


def mutate(*edits: tuple[str, Any]) -> dict:
    """``config/test.yaml`` with each ``("a.b.c", value)`` set (``DELETE`` removes the key)."""
    config = copy.deepcopy(TEST_CONFIG)
    for dotted, value in edits:
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return config


def with_model(key: str, entry: dict, **edits: Any) -> dict:
    """The test config plus one model entry (and dotted ``edits`` given as a__b=value)."""
    config = mutate(*((k.replace("__", "."), v) for k, v in edits.items()))
    config["models"][key] = entry
    return config


def duplicated_line(after: str, line: str) -> str:
    """``config/test.yaml`` as text with ``line`` inserted after the line starting with ``after``."""
    lines = TEST_YAML.splitlines()
    index = next(i for i, text in enumerate(lines) if text.startswith(after))
    return "\n".join([*lines[: index + 1], line, *lines[index + 1 :]]) + "\n"


def json_with_duplicate_model() -> str:
    """``config/test.yaml`` as tab-indented JSON whose ``models`` names ``simclr`` twice."""
    text = json.dumps(TEST_CONFIG, indent="\t")
    entry = json.dumps(TEST_CONFIG["models"]["simclr"])
    return text.replace('"models": {', '"models": {\n\t\t"simclr": ' + entry + ",", 1)


# id -> (config dict or raw YAML text, text the error must contain)
BAD_CONFIGS: dict[str, tuple[dict | str, str]] = {
    # --- top level ---------------------------------------------------------------------------
    "unknown top-level key": ({**TEST_CONFIG, "n_candidate": 8}, "'n_candidate' was unexpected"),
    "negative seed": (mutate(("seed", -1)), "instance['seed']"),
    "string seed": (mutate(("seed", "zero")), "instance['seed']"),
    "bad device": (mutate(("device", "tpu")), "instance['device']"),
    "duplicate top-level key": (
        duplicated_line("seed: 0", "seed: 1"),
        "duplicate key 'seed' at the top level",
    ),
    "seed of 2^64": (
        mutate(("identifiability.grid.seeds", [2**64])),
        "identifiability.grid.seeds[0]: seed 18446744073709551616 is outside [0, 2^63)",
    ),
    # --- NaN and inf pass every range check of a schema: refused by name (reliability README, hardening case 8) --
    "NaN generator parameter": (
        mutate(("identifiability.generators.spiral", {"angle_scale": float("nan")})),
        "identifiability.generators.spiral.angle_scale: nan is not a finite number",
    ),
    "inf weight decay": (
        mutate(("zoo.objectives.simclr.weight_decay", float("inf"))),
        "zoo.objectives.simclr.weight_decay: inf is not a finite number",
    ),
    "NaN object size": (
        mutate(("datasets.binding.object_size", float("nan"))),
        "datasets.binding.object_size: nan is not a finite number",
    ),
    # --- datasets ----------------------------------------------------------------------------
    "string n_candidates": (
        mutate(("datasets.binding.n_candidates", "eight")),
        "instance['datasets']['binding']['n_candidates']",
    ),
    "unknown dataset key": (
        mutate(("datasets.binding.colour_mode", "x")),
        "'colour_mode' was unexpected",
    ),
    "zero n_queries": (
        mutate(("datasets.binding.n_queries", 0)),
        "instance['datasets']['binding']['n_queries']",
    ),
    "odd n_pairs": (
        mutate(("datasets.binding.n_pairs", 23)),
        "instance['datasets']['binding']['n_pairs']",
    ),
    "more candidates than arrangements": (
        mutate(("datasets.binding.n_candidates", 25)),  # 3 shapes in 2x2 slots: 24 arrangements
        "datasets.binding.n_candidates = 25",
    ),
    "more objects than grid slots": (
        mutate(("datasets.binding.n_objects", 5)),
        "datasets.binding.n_objects = 5",
    ),
    "unknown shape": (
        mutate(("datasets.binding.shapes", ["circle", "square", "blob"])),
        "datasets.binding.shapes: unknown shape 'blob'",
    ),
    # --- models ------------------------------------------------------------------------------
    "empty models": (mutate(("models", {})), "instance['models']"),
    "missing models": (mutate(("models", DELETE)), "'models' is a required property"),
    "duplicate model key": (
        duplicated_line("  mae:", "  mae: {source: zoo, id: mae, family: masked_modeling}"),
        "duplicate key 'mae' in models",
    ),
    "unknown source": (
        mutate(("models.mae.source", "tensorflow")),
        "instance['models']['mae']['source']",
    ),
    "unknown family": (
        mutate(("models.mae.family", "generative")),
        "instance['models']['mae']['family']",
    ),
    "unknown model field": (mutate(("models.mae.poolng", "cls")), "'poolng' was unexpected"),
    "model without id": (
        mutate(("models.mae.id", DELETE)),
        "'id' is a required property",
    ),
    "zoo model of an undefined run": (mutate(("models.mae.id", "mae2")), "models.mae.id"),
    "shell metacharacters in a model key": (
        {**TEST_CONFIG, "models": {"a;rm -rf ~": TEST_CONFIG["models"]["mae"]}},
        "'a;rm -rf ~' does not match",
    ),
    "command substitution in a model key": (
        {**TEST_CONFIG, "models": {"$(touch pwned)": TEST_CONFIG["models"]["mae"]}},
        "'$(touch pwned)' does not match",
    ),
    "checkpoint weights missing": (
        with_model(
            "ckpt",
            {
                "source": "checkpoint",
                "id": "resnet18",
                "family": "supervised",
                "weights": "weights/missing.safetensors",
            },
        ),
        "models.ckpt.weights",
    ),
    "hub directory missing": (
        with_model(
            "hubm", {"source": "hub", "id": "resnet50", "family": "other", "repo": "hub/missing"}
        ),
        "models.hubm.repo",
    ),
    # --- zoo ---------------------------------------------------------------------------------
    "negative zoo steps": (  # 0 steps is valid: the random-initialised control
        mutate(("zoo.objectives.mae.steps", -1)),
        "instance['zoo']['objectives']['mae']['steps']",
    ),
    "unknown zoo hparam": (
        mutate(("zoo.hparams.mae.decoder_width", 32)),
        "'decoder_width' was unexpected",
    ),
    "more zoo objects than slots": (
        mutate(("zoo.scenes.max_objects", 5)),
        "zoo.scenes: need min_objects <= max_objects",
    ),
    "zoo run on an unknown backbone": (
        mutate(("zoo.objectives.mae.backbone", "convnext")),
        "zoo.objectives.mae.backbone",
    ),
    # --- embeddings --------------------------------------------------------------------------
    "zero embeddings batch_size": (
        mutate(("embeddings.batch_size", 0)),
        "instance['embeddings']['batch_size']",
    ),
    "unknown embeddings pooling": (
        mutate(("embeddings.pooling", "max")),
        "instance['embeddings']['pooling']",
    ),
    "embeddings folder missing": (
        mutate(("embeddings.folder", "images/missing")),
        "embeddings.folder",
    ),
    # --- jacobians ---------------------------------------------------------------------------
    "negative jacobians k": (mutate(("jacobians.k", -1)), "instance['jacobians']['k']"),
    "more binding probes than queries": (
        mutate(("jacobians.probes.binding.n", 100)),
        "jacobians.probes.binding.n = 100",
    ),
    "jacobian probe folder missing": (
        mutate(("jacobians.probes.folder", {"path": "images/missing", "n": 4})),
        "jacobians.probes.folder.path",
    ),
    # --- metrics -----------------------------------------------------------------------------
    "empty readout list": (
        mutate(("metrics.readouts.names", [])),
        "instance['metrics']['readouts']['names']",
    ),
    "local_pca dim not below k": (
        mutate(("metrics.readouts.local_pca.dim", 5)),
        "metrics.readouts.local_pca.dim",
    ),
    "more probe folds than pairs": (mutate(("metrics.probe.folds", 13)), "metrics.probe.folds"),
    # --- stats -------------------------------------------------------------------------------
    "too few bootstrap resamples": (
        mutate(("stats.n_bootstrap", 10)),
        "instance['stats']['n_bootstrap']",
    ),
    "covariate of no model": (mutate(("stats.covariates", ["zero_shot"])), "stats.covariates"),
    # --- identifiability ---------------------------------------------------------------------
    "n_fixed leaves no sub-sphere": (
        mutate(("identifiability.sampling.n_fixed", 2)),
        "identifiability.sampling.n_fixed",
    ),
    "unknown identifiability generator": (
        mutate(("identifiability.grid.generators", ["torus"])),
        "instance['identifiability']['grid']['generators'][0]",
    ),
    # --- alignment ---------------------------------------------------------------------------
    "alignment pair of an unknown model": (
        mutate(("alignment.real.pairs", [{"a": "barlow_twins", "b": "dinov2", "layer": "final"}])),
        "alignment.real.pairs[0].b",
    ),
    "more active concepts than concepts": (
        mutate(("alignment.synthetic.k_active", 7)),
        "alignment.synthetic.k_active",
    ),
    # --- cifar -------------------------------------------------------------------------------
    "cifar enabled without data": (
        mutate(("cifar", {"enabled": True, "data_dir": "data/no_cifar"})),
        "(config key cifar.data_dir)",
    ),
    "even cifar blur kernel": (
        mutate(("cifar.augment", {"blur_kernel": 4})),
        "cifar.augment.blur_kernel",
    ),
    # --- sugarcrepe --------------------------------------------------------------------------
    "sugarcrepe root missing": (
        with_model(
            "oc", OPEN_CLIP, sugarcrepe={"enabled": True, "root": "data/missing", "images": "x"}
        ),
        "sugarcrepe.root",
    ),
    "sugarcrepe images missing": (
        with_model(
            "oc",
            OPEN_CLIP,
            sugarcrepe={"enabled": True, "root": SUGARCREPE_ROOT, "images": "data/no_coco"},
        ),
        "sugarcrepe.images",
    ),
    "sugarcrepe model unknown": (
        mutate(("sugarcrepe.models", ["clip_vit"])),
        "sugarcrepe.models: 'clip_vit'",
    ),
    # --- hardening cases 2 and 3: weights and remote names reaching a library -------------
    "zoo backbone checkpoint_path": (
        mutate(
            (
                "zoo.backbones.vit.timm_kwargs",
                {
                    **TEST_CONFIG["zoo"]["backbones"]["vit"]["timm_kwargs"],
                    "checkpoint_path": "e.pth",
                },
            )
        ),
        "zoo.backbones.vit.timm_kwargs.checkpoint_path",
    ),
    "zoo backbone pretrained_cfg_overlay": (
        mutate(
            (
                "zoo.backbones.vit.timm_kwargs",
                {
                    **TEST_CONFIG["zoo"]["backbones"]["vit"]["timm_kwargs"],
                    "pretrained_cfg_overlay": {"file": "e.pth"},
                },
            )
        ),
        "zoo.backbones.vit.timm_kwargs.pretrained_cfg_overlay",
    ),
    "open_clip tower from the hub": (
        with_model(
            "oc",
            {**OPEN_CLIP, "kwargs": {"vision_cfg": {"timm_model_name": "hf-hub:attacker/evil"}}},
        ),
        "models.oc.kwargs.vision_cfg.timm_model_name: a model name with a hf-hub:",
    ),
    "open_clip tower from a local dir": (
        with_model(
            "oc",
            {**OPEN_CLIP, "kwargs": {"vision_cfg": {"timm_model_name": "local-dir:/tmp/x"}}},
        ),
        "models.oc.kwargs.vision_cfg.timm_model_name",
    ),
    # --- hardening case 7: sizes that would allocate past any machine ---------------------
    "n_queries 1e12": (
        mutate(("datasets.binding.n_queries", 10**12)),
        "datasets.binding.n_queries: 1000000000000 is above the cap for a count",
    ),
    "projector dims 1e9": (
        mutate(("zoo.hparams.simclr.projector_dims", [10**9, 32])),
        "zoo.hparams.simclr.projector_dims[0]: 1000000000 is above the cap for a width",
    ),
    "timm img_size 1e6": (
        with_model(
            "big",
            {
                "source": "timm",
                "id": "resnet18",
                "family": "supervised",
                "kwargs": {"img_size": 10**6},
            },
        ),
        "models.big.kwargs.img_size: 1000000 is above the cap for an image side",
    ),
    # --- hardening case 10: values that only a job would have found -----------------------
    "zoo shape unknown": (mutate(("zoo.scenes.shapes", ["blob"])), "zoo.scenes.shapes: 'blob'"),
    "zoo colour unknown": (
        mutate(("zoo.scenes.colours", ["ultraviolet"])),
        "zoo.scenes.colours: 'ultraviolet'",
    ),
    "zoo timm model misspelt": (
        mutate(("zoo.backbones.vit.timm_model", "vit_tiny_patch16_2244")),
        "zoo.backbones.vit.timm_model: 'vit_tiny_patch16_2244' is not a timm model; did you mean",
    ),
    "folder reference without a folder": (
        mutate(("metrics.reference.image_sets", ["folder"])),
        "metrics.reference.image_sets: 'folder' needs embeddings.folder",
    ),
    "alignment folder without a folder": (
        mutate(("alignment.real.image_sets", ["folder"])),
        "alignment.real.image_sets: 'folder' needs embeddings.folder",
    ),
    "zoo timm_kwargs depth two": (
        mutate(
            (
                "zoo.backbones.vit.timm_kwargs",
                {**TEST_CONFIG["zoo"]["backbones"]["vit"]["timm_kwargs"], "depth": "two"},
            )
        ),
        "zoo.backbones.vit.timm_kwargs.depth: expected an integer or a list of integers, got 'two'",
    ),
    "jacobians layer no encoder has": (
        mutate(("jacobians.layers", ["nonexistent_layer"])),
        "jacobians.layers[0]: 'nonexistent_layer' is not a tap any encoder has",
    ),
    "jacobians layer past a zoo model's blocks": (  # refused by the run's onstart check
        mutate(("jacobians.layers", ["block05"])),
        "jacobians.layers: 'block05' not among the taps of model",
    ),
    # --- hardening case 11: grid values that collide in cell names -------------------------
    "colliding paired fractions": (
        mutate(("alignment.grid.paired_fractions", [0.001, 0.0010000001])),
        "alignment.grid.paired_fractions: 0.001 and 0.0010000001 both name the cells p0.001",
    ),
    # --- hardening case 4: a JSON config (tab-indented, so PyYAML cannot read it) -----------
    "json config with a model given twice": (
        json_with_duplicate_model(),
        "duplicate key 'simclr' in models",  # libyaml reads tab-indented JSON as YAML
    ),
}

# A job announcement of Snakemake's log ("rule render_binding:", "localrule all:", "jobid: 3").
JOB_LINE = re.compile(r"^\s*(?:local)?(?:rule|checkpoint) \w+:\s*$|^\s*jobid: \d+", re.MULTILINE)


def test_the_table_has_at_least_30_cases() -> None:
    assert len(BAD_CONFIGS) >= 30


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("badconfig"))
    root = workdir / SUGARCREPE_ROOT
    root.mkdir(parents=True)
    for category in CATEGORIES:
        (root / f"{category}.json").write_text("{}")
    return workdir


# Cases also run as the real command line in a subprocess (exit code, printed message, no job
# announced, nothing written): one per kind of check, and those that only a real run's onstart
# check reaches (the in-process plan stops before it). Every case runs in process through both
# entry points below: Snakemake's own API on the Snakefile, and `repdiag validate`.
REAL_RUNS = (
    "unknown top-level key",  # the schema, did-you-mean and the file name
    "duplicate top-level key",  # the file reader
    "NaN object size",  # the numbers check
    "zoo timm model misspelt",  # a registry resolved at validation
    "json config with a model given twice",  # a JSON file
    # the onstart check (files and taps are checked by a real run, not by a dry run)
    "jacobians layer past a zoo model's blocks",
    "checkpoint weights missing",
    "hub directory missing",
)
ONSTART = set(REAL_RUNS[-3:])


def write_case(workdir: Path, case: str) -> Path:
    config = BAD_CONFIGS[case][0]
    path = workdir / "config" / f"bad_{list(BAD_CONFIGS).index(case):02d}.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def test_real_runs_name_existing_cases() -> None:
    assert set(REAL_RUNS) <= set(BAD_CONFIGS) and ONSTART <= set(REAL_RUNS)


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_is_refused_by_the_snakefile_and_by_validate(
    workdir: Path, case: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from repdiag.cli import main

    expected = BAD_CONFIGS[case][1]
    path = write_case(workdir, case)
    error = plan_in_process(workdir, path)
    if case in ONSTART:
        assert error is None, error  # planned: the real run below stops before its first job
    else:
        assert error is not None and expected in error, error
    monkeypatch.chdir(workdir)  # relative paths in a config are relative to the workflow
    assert main(["validate", str(path)]) == 2
    assert expected in capsys.readouterr().err
    for produced in ("results", "logs", "pwned"):
        assert not (workdir / produced).exists(), f"{produced} exists after {case}"


@pytest.mark.parametrize("case", REAL_RUNS)
def test_bad_config_fails_before_any_job_naming_the_key(workdir: Path, case: str) -> None:
    expected = BAD_CONFIGS[case][1]
    proc = snakemake(
        workdir, "--configfile", str(write_case(workdir, case)), check=False, timeout=300
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert expected in output, output[-3000:]
    assert not JOB_LINE.search(output), output[-3000:]
    for produced in ("results", "logs", "pwned"):
        assert not (workdir / produced).exists(), f"{produced} exists after: {output[-2000:]}"


def test_a_template_config_is_refused_by_both_entry_points(workdir: Path, tmp_path: Path) -> None:
    """Issue 36, case 1. Snakemake evaluates a YTE config's ?-expressions while reading it, before
    the Snakefile runs, so the workflow cannot stop that code; it refuses the file right after
    (no job), and `repdiag validate` (which `make run` calls first) refuses it without running
    anything. The README's Security section says so."""
    from repdiag.cli import main

    marker = workdir / "yte_ran"
    text = TEST_YAML.replace(
        "seed: 0",
        f'__use_yte__: true\nseed: ?__import__("pathlib").Path("{marker}").touch() or 0',
        1,
    )
    path = workdir / "config" / "yte.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) != 0
    assert not marker.exists()  # repdiag validate parses it as plain YAML: nothing runs
    proc = snakemake(workdir, "--configfile", str(path), check=False, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "sets __use_yte__" in output, output[-3000:]
    assert not JOB_LINE.search(output), output[-3000:]
    assert not (workdir / "results").exists()
    marker.unlink(missing_ok=True)  # Snakemake's reader ran the expression (the documented gap)


def test_a_results_folder_linked_outside_the_tree_stops_the_workflow(tmp_path: Path) -> None:
    """Issue 36, case 13: `results/datasets` linked to a folder outside the working directory."""
    workdir = copy_workflow(tmp_path / "wf")
    outside = tmp_path / "outside"
    outside.mkdir()
    (workdir / "results").mkdir()
    (workdir / "results" / "datasets").symlink_to(outside, target_is_directory=True)
    proc = snakemake(workdir, check=False, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "results/datasets resolves to" in output, output[-3000:]
    assert not JOB_LINE.search(output), output[-3000:]
    assert list(outside.iterdir()) == []


def test_uncached_pretrained_weights_stop_a_real_run_before_any_job(workdir: Path) -> None:
    """Issue 36, case 14: a timm entry with `pretrained: true` whose weights are in no cache
    (empty Hugging Face and torch.hub caches here): a real run stops in its onstart check,
    before any job, naming the model and the caches to fill, and writes nothing. A dry run
    still plans such a config (tests/workflow/test_embeddings.py plans config/paper.yaml
    without its weights); `repdiag validate` refuses it unless given --no-weights
    (tests/core/test_cli.py::test_validate_checks_weights_caches_unless_told_not_to)."""
    caches = workdir / "empty_caches"
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(caches / "hf"),
        "HUGGINGFACE_HUB_CACHE": str(caches / "hf" / "hub"),
        "HF_HUB_CACHE": str(caches / "hf" / "hub"),
        "TORCH_HOME": str(caches / "torch"),
    }
    entry = {"source": "timm", "id": "resnet18", "family": "supervised", "pretrained": True}
    path = workdir / "config" / "uncached.yaml"
    path.write_text(yaml.safe_dump(with_model("pre", entry)))
    expected = (
        "model 'pre': pretrained weights of timm model 'resnet18' are not in the local Hugging "
        f"Face cache {caches / 'hf' / 'hub'} (timm/resnet18.a1_in1k) or the torch.hub cache "
        f"{caches / 'torch' / 'hub' / 'checkpoints'} and nothing is downloaded here"
    )
    proc = snakemake(workdir, "--configfile", str(path), check=False, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and expected in output, output[-3000:]
    assert "in __onstart" in output, output[-3000:]
    assert not JOB_LINE.search(output), output[-3000:]
    for produced in ("results", "logs"):
        assert not (workdir / produced).exists(), f"{produced} exists after: {output[-2000:]}"
