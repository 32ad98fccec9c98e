"""benchmarks/gpu.sh at its tiny size on the CPU: every field it reports, with sane values."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = pytest.mark.xdist_group("benchmarks/test_gpu")

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "mode", "device", "device_name", "torch", "threads", "model", "image_size", "k",
    "power_iters", "matmul", "flops", "throughput", "accuracy", "repeatable", "other_encoder",
    "vmap_fallbacks", "skipped", "effective_precision", "elapsed_s", "paper_pass",
    "peak_tflops", "projection",
}  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "gpu.json"
    # the tiny run has no budget (every step runs); gpu.sh's timeout is only a hang guard here
    env = {
        **os.environ,
        "REPDIAG_PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
        "REPDIAG_GPU_BENCH_TIMEOUT_S": "3000",
    }
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "benchmarks" / "gpu.sh"),
            "--tiny",
            "--device",
            "cpu",
            "--json",
            str(out),
            "--runtimes",
            str(out.with_name("runtimes.yaml")),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,  # hang guard only
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # the summary line, the projection, then one per run
    printed = json.loads(lines[0])
    result = json.loads(out.read_text())
    assert printed["accuracy"] == result["accuracy"]
    assert lines[1].startswith("projection: config/test.yaml Jacobian stage")
    table = yaml.safe_load(out.with_name("runtimes.yaml").read_text())
    assert table == {
        key: model["runtime_min_suggested"] for key, model in result["projection"]["models"].items()
    }
    return result


def test_the_tiny_run_reports_every_field_and_skips_nothing(report):
    assert set(report) == FIELDS
    assert report["mode"] == "tiny" and report["device"] == "cpu"
    assert report["skipped"] == [] and report["vmap_fallbacks"] == []  # batching rules for all
    assert report["effective_precision"] == {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16"}
    for precision in ("fp32", "tf32", "bf16"):
        assert report["matmul"][precision]["tflops"] > 0 and report["matmul"][precision]["n"] == 256


def test_throughput_covers_every_method_and_batch_size(report):
    rows = {(r["method"], r["precision"], r["batch_size"]): r for r in report["throughput"]}
    expected = {(m, "fp32", bs) for m in ("exact", "randomized", "auto") for bs in (16, 64)}
    assert expected | {("auto", "tf32", 16), ("auto", "bf16", 16)} <= set(rows)
    for row in rows.values():
        assert row["images_per_s"] > 0 and row["peak_mib"] >= 0
        assert 0 < row["fraction_of_matmul"]
    # the engine's passes (2-block width-32 ViT: 3 taps 32 wide, k = 4, 2 images): exact takes
    # batch // 32 images per pass, 32 products each; randomized all 2 x 4 products at once
    assert rows[("exact", "fp32", 16)]["products_per_pass"]["exact"] == 16
    assert rows[("exact", "fp32", 64)]["products_per_pass"]["exact"] == 64
    assert rows[("randomized", "fp32", 64)]["products_per_pass"]["randomized"] == 8
    assert rows[("randomized", "fp32", 64)]["same_as"] == {"method": "auto", "batch_size": 16}
    flops = report["flops"]
    assert set(flops["exact"]["methods"].values()) == {"exact"}
    assert set(flops["auto"]["methods"].values()) == {"randomized"}  # 32 > k (2q + 2) = 16
    assert all(flops[m]["tflop_per_image"] > 0 for m in ("exact", "randomized", "auto"))


def test_accuracy_against_float64_repeatability_and_the_shortcut_free_encoder(report):
    accuracy = report["accuracy"]
    assert accuracy["reference"] == "cpu float64" and accuracy["layers"] == [
        "block00",
        "block01",
        "final",
    ]
    assert accuracy["fp32"]["max_rel_jer_error"] < 1e-5  # float32 rounding only
    assert accuracy["tf32"] == accuracy["fp32"]  # no TF32 on a CPU: the same computation
    assert 1e-6 < accuracy["bf16"]["max_rel_jer_error"] < 0.05  # bfloat16's 8-bit mantissa
    assert report["repeatable"] == {"fp32": True, "tf32": True}
    other = report["other_encoder"]
    assert other["derived_taps"] == [] and other["layers"] == 4  # block00, block01, final, head
    assert other["methods"]["head"] == "exact" and other["images_per_s"] > 0  # 16 <= 16


def _gpu_module():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_products_per_pass_follows_the_engine_batching():
    gpu = _gpu_module()
    d_out = {"block00": 768, "final": 768}
    exact = {"block00": "exact", "final": "exact"}
    randomized = {"block00": "randomized", "final": "randomized"}
    # exact: max(1, batch // 768) images per pass, 768 one-hot cotangents each
    assert gpu.products_per_pass(exact, d_out, 4, 32, 512)["exact"] == 512
    assert gpu.products_per_pass(exact, d_out, 4, 32, 2048)["exact"] == 1536
    # randomized: batch // k images per pass, k directions each
    assert gpu.products_per_pass(randomized, d_out, 4, 32, 2048)["randomized"] == 128
    assert gpu.products_per_pass(randomized, d_out, 100, 32, 2048)["randomized"] == 2048


def test_the_tiny_size_has_no_budget_and_a_budget_skips_by_estimate():
    gpu = _gpu_module()
    steps = importlib.import_module("gpu_steps")  # on sys.path once benchmarks/gpu.py is loaded
    assert gpu.SIZES["tiny"]["budget_s"] is None
    unbounded = steps.Budget(None)
    assert unbounded.allows(1e12) and unbounded.left() is None
    bounded = steps.Budget(1e6)  # what is skipped follows the estimate against the budget
    assert bounded.allows(1.0) and not bounded.allows(2e6)


def test_the_paper_pass_in_every_precision_against_the_peaks(report):
    """The paper's pass at tiny size on the four architectures: rates consistent with the
    planned FLOPs and the seconds, fractions of the H200 datasheet peaks and of the measured
    matmul rate, JER errors against float32; repeatability on the ViT-B stand-in."""
    peaks = report["peak_tflops"]
    assert (peaks["fp32"], peaks["tf32"], peaks["bf16"]) == (66.9, 494.7, 989.4)
    rows = report["paper_pass"]
    assert list(rows) == ["vit_l14", "vit_b16", "convnext_b", "resnet50"]
    assert rows["vit_l14"]["layers"] == ["block01", "final"]  # a middle block and final
    for name, row in rows.items():
        assert row["images"] == 2 and row["tflop"] > 0, name
        assert row["tflop"] == pytest.approx(2 * row["tflop_per_image"])
        for precision in ("fp32", "tf32", "bf16"):
            cell = row[precision]
            assert "error" not in cell, (name, precision, cell)  # all four run in all three
            assert cell["tflops"] == pytest.approx(row["tflop"] / cell["s"])
            assert cell["fraction_of_peak"] == pytest.approx(cell["tflops"] / peaks[precision])
            matmul = report["matmul"][precision]["tflops"]
            assert cell["fraction_of_matmul"] == pytest.approx(cell["tflops"] / matmul)
        assert row["fp32"]["max_rel_jer_error_vs_fp32"] == 0.0
        assert row["tf32"]["max_rel_jer_error_vs_fp32"] == 0.0  # no TF32 on a CPU
        assert 1e-6 < row["bf16"]["max_rel_jer_error_vs_fp32"] < 0.05, name
    repeat = rows["vit_b16"]["repeatability"]
    assert repeat["bitwise_equal"] is True
    assert repeat["deterministic_cost"] == pytest.approx(
        repeat["deterministic_s"] / repeat["nondeterministic_s"] - 1
    )


def test_the_projection_uses_the_measured_rates_and_the_slurm_runtime(report):
    from repdiag.core.slurm import RUNTIMES_FILE, jacobian_runtime, runtime_minutes

    projection = report["projection"]
    rates = {name: row["fp32"]["tflops"] for name, row in report["paper_pass"].items()}
    assert projection["config"] == "config/test.yaml" and projection["models"]
    total = 0.0
    for key, model in projection["models"].items():
        # config/test.yaml's models are zoo runs on the ViT backbone: the ViT-B stand-in's rate
        # (the projection is made during the paper pass, before the all-tap run)
        assert model["architecture"] == "ViT-S/B" and model["rate_from"] == "vit_b16", key
        hours = model["pflop"] * 1e15 / (rates[model["rate_from"]] * 1e12) / 3600
        assert model["hours"] == pytest.approx(hours), key
        assert model["hours_by_precision"]["fp32"] == model["hours"]
        runtime = jacobian_runtime(key, 1, ROOT / RUNTIMES_FILE)
        assert model["slurm_runtime_min"] == runtime
        assert model["fits_runtime"] == (model["hours"] * 60 <= runtime)
        assert model["runtime_min_suggested"] == runtime_minutes(model["hours"])
        total += model["hours"]
    assert projection["stage_hours"] == pytest.approx(total)
    assert projection["stage_pflop"] == pytest.approx(
        sum(m["pflop"] for m in projection["models"].values())
    )


def _gpu_report_module():
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "benchmarks/gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_report_renders_the_tiny_run_with_its_own_numbers(report):
    text = _gpu_report_module().render(report)
    for row in report["paper_pass"].values():
        assert f"`{row['model']}`" in text and f"{row['fp32']['tflops']:.1f}" in text
    assert f"{report['projection']['stage_pflop']:.0f} PFLOP" in text
    assert "skipped: nothing" in text  # the tiny run has no budget


def test_the_performance_page_shows_the_committed_gpu_run(tmp_path):
    gpu_report = _gpu_report_module()
    committed = json.loads((ROOT / "benchmarks/measured/gpu-h200.json").read_text())
    assert committed["device"] == "cuda" and committed["skipped"] == []
    page = tmp_path / "performance.md"
    page.write_text((ROOT / "docs/performance.md").read_text())
    gpu_report.write_block(page, gpu_report.render(committed))
    assert page.read_text() == (ROOT / "docs/performance.md").read_text(), (
        "docs/performance.md's GPU block is stale: "
        "benchmarks/gpu_report.py benchmarks/measured/gpu-h200.json --write docs/performance.md"
    )
    # the SLURM runtimes the rule reads are this run's suggestions
    from repdiag.core.slurm import RUNTIMES_FILE, jacobian_runtime

    for key, model in committed["projection"]["models"].items():
        assert jacobian_runtime(key, 1, ROOT / RUNTIMES_FILE) == model["runtime_min_suggested"]


def _gpu_paper_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("gpu_paper")


# config/paper.yaml's models by the measurement of benchmarks/measured/gpu-h200.json whose rate
# each must take: its own architecture's (ViT-S/B: the all-tap ViT-B/16 run), never another's
OWN_RATE = {
    **dict.fromkeys(
        ["barlow_twins_rn50", "vicreg_rn50", "vicreg_rn50w2", "dino_rn50", "swav_rn50",
         "mocov3_rn50", "clip_rn50", "resnet50_supervised"], "resnet50"),
    **dict.fromkeys(["mae_vit_l16", "dinov2_vit_l14", "clip_vit_l14", "eva02_clip_l14"], "vit_l14"),
    "convnext_b": "convnext_b",
    **dict.fromkeys(
        ["mae_vit_b16", "beit_vit_b16", "beitv2_vit_b16", "dino_vit_s16", "dino_vit_b16",
         "dinov2_vit_s14", "dinov2_vit_b14", "mocov3_vit_b16", "clip_vit_b32", "clip_vit_b16",
         "siglip_vit_b16", "eva02_clip_b16", "vit_b16_supervised"], "all_taps"),
}  # fmt: skip
CONTROLS = ["shape_oracle", "layout_mask", "occupancy", "slot_area", "colour_histogram",
            "bag_of_shapes", "random_features"]  # fmt: skip


def test_the_committed_projection_gives_each_model_its_own_architectures_rate(capsys):
    """Issue #59: ten ViT-B-class models had ViT-L's rate and six ResNet-50s ConvNeXt's (the
    nearest in FLOPs per image). Now each takes its own architecture's; the totals equal an
    independent computation from the JSON's measured cells."""
    gpu_paper = _gpu_paper_module()
    committed = json.loads((ROOT / "benchmarks/measured/gpu-h200.json").read_text())
    projection = gpu_paper.main([str(ROOT / "benchmarks/measured/gpu-h200.json")])
    models = projection["models"]
    assert set(models) == set(OWN_RATE) | set(CONTROLS)
    for key, source in OWN_RATE.items():
        assert models[key]["rate_from"] == source, key
    vit_b_class = [k for k, s in OWN_RATE.items() if s == "all_taps" and "_s1" not in k]
    assert len(vit_b_class) == 11 and not any(
        models[k]["rate_from"] == "vit_l14" for k in vit_b_class
    )
    resnets = [k for k, s in OWN_RATE.items() if s == "resnet50"]
    assert not any(models[k]["rate_from"] == "convnext_b" for k in resnets)

    # the rates, read from the JSON's cells here: the paper pass, and the all-tap auto runs
    rates = {
        name: {p: row[p]["tflops"] for p in ("fp32", "tf32", "bf16")}
        for name, row in committed["paper_pass"].items()
    }
    rates["all_taps"] = {
        row["precision"]: row["tflops"]
        for row in committed["throughput"]
        if row["method"] == "auto" and row["batch_size"] == 256
    }
    assert rates["all_taps"]["fp32"] == pytest.approx(28.3388, abs=1e-4)
    for precision in ("fp32", "tf32", "bf16"):
        slowest = min(r[precision] for r in rates.values())
        total = 0.0
        for key, stored in committed["projection"]["models"].items():
            rate = rates[OWN_RATE[key]][precision] if key in OWN_RATE else slowest
            hours = stored["pflop"] * 1e15 / (rate * 1e12) / 3600
            assert models[key]["hours_by_precision"][precision] == pytest.approx(hours), key
            total += hours
        assert projection["stage_hours_by_precision"][precision] == pytest.approx(total)
    hours = projection["stage_hours_by_precision"]
    assert projection["stage_hours"] == hours["fp32"]
    assert (round(hours["fp32"], 2), round(hours["tf32"], 2)) == (8.12, 4.00)  # was 7.44 at FP32
    assert projection["stage_pflop"] == pytest.approx(committed["projection"]["stage_pflop"])
    # the rates changed, the suggested runtimes did not: profiles/slurm/ still holds them
    for key, model in committed["projection"]["models"].items():
        assert models[key]["runtime_min_suggested"] == model["runtime_min_suggested"], key
    printed = capsys.readouterr().out
    assert "FP32 8.12 GPU-hours, TF32 4.00 GPU-hours" in printed.splitlines()[0]


def test_a_models_architecture_comes_from_its_name():
    gpu_paper = _gpu_paper_module()
    architecture = gpu_paper.architecture
    for name in ("vit_large_patch14_clip_224", "ViT-L-14", "EVA02-L-14", "vit_large_patch16_224.mae",
                 "vit_large_patch14_dinov2.lvd142m"):  # fmt: skip
        assert architecture(name) == "ViT-L", name
    for name in ("vit_base_patch16_224", "ViT-B-32", "ViT-B-16-SigLIP", "EVA02-B-16",
                 "beitv2_base_patch16_224.in1k_ft_in22k_in1k", "vit_small_patch14_dinov2.lvd142m"):  # fmt: skip
        assert architecture(name) == "ViT-S/B", name
    for name in ("resnet50", "resnet50x2", "dino_resnet50", "RN50", "resnet10t"):
        assert architecture(name) == "ResNet", name
    assert architecture("convnext_base.fb_in22k_ft_in1k") == "ConvNeXt"
    assert architecture("repdiag.binding.controls:occupancy") is None
    committed = json.loads((ROOT / "benchmarks/measured/gpu-h200.json").read_text())
    for key, row in committed["paper_pass"].items():  # the names agree with the roles
        assert architecture(row["model"]) == gpu_paper.BENCHMARK_ARCHITECTURE[key], key
    archs = gpu_paper.config_architectures("config/paper.yaml")
    assert [k for k, a in archs.items() if a is None] == CONTROLS


def test_the_rate_is_the_closest_tap_configuration_of_the_same_architecture():
    choose = _gpu_paper_module().choose_rate
    measured = [
        {"from": "b_final", "architecture": "ViT-S/B", "taps": 1, "tflops": {"fp32": 1, "tf32": 2}},
        {"from": "b_all", "architecture": "ViT-S/B", "taps": 13, "tflops": {"fp32": 3}},
        {"from": "l_two", "architecture": "ViT-L", "taps": 2, "tflops": {"fp32": 5, "tf32": 6}},
    ]
    assert choose(measured, "ViT-S/B", 16, "fp32")["from"] == "b_all"
    assert choose(measured, "ViT-S/B", None, "fp32")["from"] == "b_all"  # every tap planned
    assert choose(measured, "ViT-S/B", 2, "fp32")["from"] == "b_final"
    assert choose(measured, "ViT-S/B", 16, "tf32")["from"] == "b_final"  # all-tap has no TF32
    assert choose(measured, "ViT-L", 1, "fp32")["from"] == "l_two"
    assert choose(measured, "ConvNeXt", 1, "fp32") is None  # never another architecture's
    assert choose(measured, None, 1, "fp32") is None
