"""Jacobian stage: probe sets, the depth profile, running the stage into its store and JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from repdiag.binding.jacobian_stage import (
    Probes,
    depth_drops,
    layer_summaries,
    load_probes,
    mean_ci,
    noise_images,
    run_stage,
    summary,
)
from repdiag.core.errors import ConfigError
from repdiag.core.store import open_store, read_json
from repdiag.encoders.jacobian.cache import DEFAULT_BATCH_SIZE
from repdiag.encoders.jacobian.jer import jer
from repdiag.encoders.jacobian.options import JacobianSettings
from repdiag.encoders.jacobian.store import spectra_dataset
from repdiag.encoders.preprocess import Preprocess
from tests.encoders.jacobian.models import fake_spectra

torch.set_num_threads(1)


def _write_pngs(folder, count):
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(
            folder / f"img{i}.png"
        )


def test_noise_images_are_seeded_gaussian_pixels():
    first = noise_images(6, 16, 0.2, seed=3)
    assert first.shape == (6, 16, 16, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, noise_images(6, 16, 0.2, seed=3))
    assert not np.array_equal(first, noise_images(6, 16, 0.2, seed=4))
    pixels = first.astype(np.float64) / 255.0  # std 0.2: clipping at 0 and 1 is negligible (2.5 sd)
    assert pixels.mean() == pytest.approx(0.5, abs=0.01)
    assert pixels.std() == pytest.approx(0.2, rel=0.03)


def test_load_probes_noise_and_folder_preprocessed_in_order(tmp_path):
    _write_pngs(tmp_path / "natural", 3)
    preprocess = Preprocess(16)
    probes = load_probes(
        {
            "binding": {"n": 0},
            "noise": {"n": 2, "std": 0.25},
            "folder": {"path": str(tmp_path / "natural"), "n": 2},
        },
        preprocess,
        seed=1,
    )
    assert probes.ids == ["noise/n00000", "noise/n00001", "folder/img0.png", "folder/img1.png"]
    assert probes.probe_set == ["noise", "noise", "folder", "folder"]
    assert probes.x.shape == (4, 3, 16, 16) and probes.counts() == {"folder": 2, "noise": 2}
    torch.testing.assert_close(probes.x[:2], preprocess(noise_images(2, 16, 0.25, seed=1)))


def test_load_probes_errors_name_the_key(tmp_path):
    preprocess = Preprocess(16)
    with pytest.raises(ConfigError, match=r"jacobians\.probes\.folder\.path"):
        load_probes({"folder": {"path": str(tmp_path / "missing"), "n": 2}}, preprocess, seed=0)
    with pytest.raises(
        ConfigError, match=r"jacobians\.probes\.binding\.n > 0 needs the binding store"
    ):
        load_probes({"binding": {"n": 2}}, preprocess, seed=0)
    with pytest.raises(ConfigError, match="no probe images"):
        load_probes({"binding": {"n": 0}, "noise": {"n": 0}}, preprocess, seed=0)


def test_mean_ci_is_the_student_t_interval():
    values = np.array([1.0, 2.5, 2.0, 4.0, 3.5])
    low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    result = mean_ci(values)
    assert result["mean"] == pytest.approx(2.6) and result["n"] == 5
    assert result["ci_low"] == pytest.approx(low) and result["ci_high"] == pytest.approx(high)
    assert mean_ci(np.array([3.0])) == {
        "mean": 3.0,
        "ci_low": None,
        "ci_high": None,
        "std": None,
        "n": 1,
    }


def test_depth_profile_summarises_each_layer_probe_set_and_formula():
    ds = spectra_dataset(
        fake_spectra(), ["a", "b", "c"], ["binding", "noise", "noise"], k=3, formulas=["pr", "pr2"]
    )
    ds.attrs.update(
        {
            "method": "auto",
            "power_iters": 5,
            "seed": 0,
            "device": "cpu",
            "probe_sets": {"binding": 1, "noise": 2},
        }
    )
    profile = layer_summaries(ds, ["pr", "pr2"])
    assert list(profile) == ["block00", "head"] and list(profile["head"]) == ["binding", "noise"]
    noise_pr = [
        jer(torch.tensor([1.0, 1.0, 0.0]), "pr").item(),
        jer(torch.tensor([2.0, 2.0, 2.0]), "pr").item(),
    ]
    assert profile["block00"]["noise"]["pr"]["mean"] == pytest.approx(np.mean(noise_pr), rel=1e-6)
    assert profile["block00"]["binding"]["pr2"]["n"] == 1
    report = summary(ds, "toy", ["pr", "pr2"])
    assert report["methods"]["head"] == "randomized" and report["layers"] == ["block00", "head"]
    assert report["depth_drops"] == depth_drops(ds, ["pr", "pr2"])
    assert report["depth_drops"]["head"]["noise"]["pr"]["from"] == "block00"
    json.dumps(report, allow_nan=False)  # valid JSON


def test_depth_drops_are_paired_per_image_differences_with_a_t_interval():
    import xarray as xr

    jer_pr = np.array([[10.0, 12.0, 11.0, 5.0], [6.0, 7.5, 6.0, 5.0], [6.0, 7.5, 6.0, 5.0]])
    ds = xr.Dataset(
        {"jer_pr": (("layer", "image"), jer_pr)},
        coords={
            "layer": ["a", "b", "c"],
            "image": ["q0", "q1", "q2", "n0"],
            "probe_set": ("image", ["binding", "binding", "binding", "noise"]),
        },
    )
    drops = depth_drops(ds, ["pr"])
    assert list(drops) == ["b", "c"]  # the first layer has nothing before it
    entry = drops["b"]["binding"]["pr"]
    paired = np.array([4.0, 4.5, 5.0])  # JER_a(x) - JER_b(x), image by image
    low, high = stats.t.interval(0.95, 2, loc=paired.mean(), scale=stats.sem(paired))
    assert entry["from"] == "a" and entry["n"] == 3
    assert entry["mean"] == pytest.approx(4.5) and entry["relative"] == pytest.approx(4.5 / 11)
    assert (entry["ci_low"], entry["ci_high"]) == pytest.approx((low, high))
    flat = drops["c"]["binding"]["pr"]
    assert flat["mean"] == 0.0 and flat["ci_low"] == flat["ci_high"] == 0.0
    assert drops["b"]["noise"]["pr"] == {
        "from": "a",
        "mean": 0.0,
        "ci_low": None,
        "ci_high": None,
        "std": None,
        "n": 1,
        "relative": 0.0,
    }


def test_run_stage_writes_store_and_json_and_drops_its_cache(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3), nn.Tanh())  # 3 < k: zero-padded
    x = torch.randn(3, 3, 8, 8)
    probes = Probes(
        ids=["noise/n0", "noise/n1", "folder/a.png"], probe_set=["noise", "noise", "folder"], x=x
    )
    options = JacobianSettings.from_config({"k": 4, "chunk_size": 2})
    ds = run_stage(
        model,
        probes,
        options,
        model="toy",
        device=torch.device("cpu"),
        store=tmp_path / "toy.zarr",
        summary_path=tmp_path / "toy.json",
        cache_root=tmp_path / ".cache",
    )
    assert not (tmp_path / ".cache" / "toy").exists()
    stored = open_store(
        tmp_path / "toy.zarr", required=["singular_values", "jer_pr", "jer_pr2", "jer_entropy"]
    )
    assert stored.attrs["methods"] == {"output": "exact"} and stored.attrs["device"] == "cpu"
    # the products per pass used, beside the setting they came from (null: the device's default)
    assert stored.attrs["batch_size_setting"] == options.batch_size
    assert stored.attrs["batch_size"] == (options.batch_size or DEFAULT_BATCH_SIZE["cpu"])
    assert stored["singular_values"].shape == (1, 3, 4)
    assert (
        float(stored["singular_values"][0, :, 2].min()) > 0
        and float(abs(stored["singular_values"][0, :, 3]).max()) == 0
    )
    np.testing.assert_array_equal(
        stored["singular_values_full"].values, stored["singular_values"].values[..., :3]
    )
    report = read_json(tmp_path / "toy.json")
    profile = report["depth_profile"]["output"]
    assert profile["noise"]["pr"]["mean"] == pytest.approx(
        float(ds["jer_pr"].values[0, :2].mean()), rel=1e-6
    )
    assert (
        profile["noise"]["pr"]["ci_low"]
        <= profile["noise"]["pr"]["mean"]
        <= profile["noise"]["pr"]["ci_high"]
    )


def test_run_stage_records_precision_and_numerics_and_keys_the_cache_by_them(tmp_path, monkeypatch):
    from repdiag.binding import jacobian_stage

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3, bias=False))
    probes = Probes(
        ids=["noise/n0", "noise/n1"], probe_set=["noise", "noise"], x=torch.randn(2, 3, 4, 4)
    )
    keys, real_key = [], jacobian_stage.cache_key
    monkeypatch.setattr(
        jacobian_stage,
        "cache_key",
        lambda settings, *a: keys.append(settings) or real_key(settings, *a),
    )
    stores = {}
    for precision in ("fp32", "bf16"):
        options = JacobianSettings.from_config({"k": 3, "precision": precision})
        run_stage(
            model,
            probes,
            options,
            model="toy",
            device=torch.device("cpu"),
            store=tmp_path / f"{precision}.zarr",
            summary_path=tmp_path / f"{precision}.json",
            cache_root=tmp_path / ".cache",
        )
        stores[precision] = open_store(tmp_path / f"{precision}.zarr", required=["singular_values"])
        assert read_json(tmp_path / f"{precision}.json")["precision"] == precision
    assert [settings["precision"] for settings in keys] == ["fp32", "bf16"]
    assert real_key(keys[0], "m", "x") != real_key(keys[1], "m", "x")
    weight = model[1].weight.detach()
    for precision, matrix in (("fp32", weight), ("bf16", weight.bfloat16().float())):
        attrs = stores[precision].attrs
        assert attrs["precision"] == attrs["numerics"]["precision_effective"] == precision
        # the provenance snapshot is taken inside the block: full float32 switches, as recorded
        assert attrs["provenance"]["numerics"]["tf32"] == attrs["numerics"]["tf32"]
        assert attrs["provenance"]["numerics"]["tf32"]["cuda.matmul.fp32_precision"] in (
            "ieee",
            False,
        )
        np.testing.assert_allclose(  # J of a linear map is its (bfloat16-rounded) weight
            stores[precision]["singular_values"].values[0],
            np.tile(torch.linalg.svdvals(matrix).numpy(), (2, 1)),
            rtol=1e-6,
        )
