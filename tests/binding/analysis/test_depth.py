"""JER by depth from the Jacobian stores: the per-layer drop's paired interval and the headline
JER of one model (repdiag.binding.analysis.depth)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy import stats as sps

from repdiag.binding.analysis.depth import headline_jer
from repdiag.binding.analysis.options import StatsSettings
from tests.binding.stats_fakes import depth_profile, fake_jacobian_store


def test_depth_profile_drop_is_the_paired_t_interval_over_images():
    rng = np.random.default_rng(0)
    per_image = rng.uniform(5, 30, size=(3, 12))
    profile = depth_profile(per_image).set_index("layer")
    assert np.isnan(profile.loc["block00", "drop_mean"])
    paired = per_image[0] - per_image[1]
    low, high = sps.t.interval(0.95, 11, loc=paired.mean(), scale=sps.sem(paired))
    assert profile.loc["block01", "drop_mean"] == pytest.approx(paired.mean())
    assert profile.loc["block01", "drop_ci_low"] == pytest.approx(low)
    assert profile.loc["block01", "drop_ci_high"] == pytest.approx(high)


def test_headline_jer_reads_the_store_like_the_statistics_stage(tmp_path) -> None:
    path = tmp_path / "clip.zarr"
    fake_jacobian_store(path, 0.5, np.random.default_rng(0))
    ds = xr.open_zarr(path, zarr_format=3)
    binding = ds["probe_set"].values == "binding"
    expected = float(ds["jer_pr"].sel(layer="final").values[binding].mean())
    settings = StatsSettings.from_config({"n_bootstrap": 200, "seed": 0})
    assert headline_jer(path, "clip", "vision_language", settings) == pytest.approx(
        expected, rel=1e-6
    )
    noise = StatsSettings.from_config(
        {"probe_set": "noise", "jer_formula": "entropy", "jer_at": "max"}
    )
    per_layer = ds["jer_entropy"].values[:, ds["probe_set"].values == "noise"].mean(axis=1)
    assert headline_jer(path, "clip", "vision_language", noise) == pytest.approx(
        per_layer.max(), rel=1e-6
    )
