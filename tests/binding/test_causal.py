"""The JER intervention's analysis: per-seed contrasts against the sham and plain with
t-intervals over seeds and their parametric p, the loss screen, the full-spectrum JER."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from repdiag.binding.causal import (
    arm_table,
    causal_contrasts,
    full_spectrum_jer,
    full_spectrum_participation,
    run_record,
    screen_losses,
    seed_contrast,
)
from repdiag.core.errors import StoreError
from repdiag.core.store import write_json, write_store

ARMS = ("plain", "raise", "lower", "sham")
# binding per arm and seed (4 seeds): raise and lower sit near the sham, plain above it
BINDING = {
    "plain": [0.74, 0.82, 0.78, 0.80],
    "raise": [0.70, 0.75, 0.71, 0.77],
    "lower": [0.66, 0.70, 0.69, 0.72],
    "sham": [0.68, 0.74, 0.70, 0.73],
}
LOSS = {
    "plain": [2.00, 2.02, 1.98, 2.01],
    "raise": [2.01, 2.03, 1.99, 2.00],
    "lower": [2.02, 2.01, 2.00, 2.40],  # seed 3's lower run: far outside the plain spread
    "sham": [2.00, 2.02, 2.01, 2.00],
}


def arms_frame(base: str = "causal_1") -> pd.DataFrame:
    rows = []
    for arm in ARMS:
        for seed in range(4):
            b = BINDING[arm][seed]
            rows.append(
                {
                    "base": base,
                    "dose": 1.0,
                    "arm": arm,
                    "seed": seed,
                    "model": f"{base}_{arm}_s{seed}",
                    "binding": b,
                    "binding_ci_low": b - 0.04,
                    "binding_ci_high": b + 0.04,
                    "same_different": 0.5 + b / 2,
                    "jer": 27.0 + {"raise": 2.0, "lower": -5.0}.get(arm, 0.0) + 0.1 * seed,
                    "pr_full": 30.0 + {"raise": 10.0, "lower": -8.0}.get(arm, 0.0) + seed,
                    "pr2_full": 20.0 + {"raise": 40.0}.get(arm, 0.0),
                    "final_loss": LOSS[arm][seed],
                }
            )
    return pd.DataFrame(rows)


def test_the_contrast_is_the_t_interval_of_the_per_seed_differences_with_its_p() -> None:
    arms = screen_losses(arms_frame(), 2.0)
    row = seed_contrast(arms, "binding", "raise", "sham", 0.95)
    diffs = np.subtract(BINDING["raise"], BINDING["sham"])
    n, mean, sd = 4, diffs.mean(), diffs.std(ddof=1)
    half = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert (row["n"], row["mean"], row["sd"]) == (n, pytest.approx(mean), pytest.approx(sd))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((mean - half, mean + half))
    assert row["p"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue)
    assert row["unit"] == "training run (seed)" and row["seeds"] == "0 1 2 3"


def test_a_run_outside_the_plain_seed_spread_is_left_out_and_so_is_its_seed_pair() -> None:
    arms = screen_losses(arms_frame(), 2.0)
    plain = np.array(LOSS["plain"])
    z = (2.40 - plain.mean()) / plain.std(ddof=1)
    out = arms.set_index("model")
    assert out.loc["causal_1_lower_s3", "loss_z"] == pytest.approx(z)
    assert out["left_out"].sum() == 1 and out.loc["causal_1_lower_s3", "left_out"]
    row = seed_contrast(arms, "binding", "lower", "sham", 0.95)
    assert row["n"] == 3 and row["seeds"] == "0 1 2" and row["seeds_left_out"] == "3"
    diffs = np.subtract(BINDING["lower"], BINDING["sham"])[:3]
    assert row["mean"] == pytest.approx(diffs.mean())
    # raise keeps all four seeds: the screen acts on the runs it names only
    assert seed_contrast(arms, "binding", "raise", "sham", 0.95)["n"] == 4


def test_one_plain_seed_gives_no_spread_and_leaves_nothing_out() -> None:
    arms = arms_frame()
    arms = arms[arms["seed"] == 3]
    screened = screen_losses(arms, 2.0)
    assert not screened["left_out"].any() and screened["plain_loss_sd"].isna().all()
    row = seed_contrast(screened, "binding", "raise", "sham", 0.95)
    assert row["n"] == 1 and math.isnan(row["ci_low"]) and math.isnan(row["p"])


def test_contrasts_cover_effects_and_the_manipulation_check_against_sham_and_plain() -> None:
    arms = screen_losses(pd.concat([arms_frame("causal_0p3"), arms_frame("causal_1")]), 2.0)
    table = causal_contrasts(arms, 0.95)
    assert set(table["base"]) == {"causal_0p3", "causal_1"}
    one = table[table["base"] == "causal_1"]
    effects = one[one["role"] == "effect"]
    assert set(effects["metric"]) == {"binding", "same_different"}
    assert set(zip(effects["arm"], effects["reference"], strict=True)) == {
        ("raise", "sham"),
        ("lower", "sham"),
        ("plain", "sham"),
        ("raise", "plain"),
        ("lower", "plain"),
        ("sham", "plain"),
    }
    checks = one[one["role"] == "manipulation"].set_index(["metric", "arm", "reference"])
    assert set(checks.index.get_level_values("metric")) == {"jer", "pr_full", "pr2_full"}
    assert checks.loc[("jer", "raise", "sham"), "mean"] == pytest.approx(2.0)
    assert checks.loc[("pr2_full", "raise", "plain"), "mean"] == pytest.approx(40.0)
    # a constant difference: zero spread, the interval collapses on it
    assert checks.loc[("pr2_full", "raise", "plain"), "sd"] == 0.0
    # lower's seed 3 left out: 3 seeds in each of its contrasts
    assert checks.loc[("pr_full", "lower", "plain"), "n"] == 3
    assert checks.loc[("pr_full", "lower", "plain"), "mean"] == pytest.approx(-8.0)


def test_arms_without_lower_still_compare_what_they_have() -> None:
    arms = screen_losses(arms_frame().query("arm != 'lower'"), 2.0)
    table = causal_contrasts(arms, 0.95)
    assert "lower" not in set(table["arm"]) and "lower" not in set(table["reference"])
    assert len(table) == 5 * 4  # 5 metrics x (raise, plain vs sham; raise, sham vs plain)


def test_full_spectrum_participation_against_closed_forms() -> None:
    assert full_spectrum_participation(np.ones(7)) == pytest.approx((7.0, 7.0))
    s = np.array([3.0, 1.0, 0.0])  # a rank-2 map: the zero adds nothing
    assert full_spectrum_participation(s) == pytest.approx((16 / 10, 100 / 82))
    assert all(math.isnan(v) for v in full_spectrum_participation(np.zeros(4)))


def full_store(path, exact: bool = True) -> np.ndarray:
    """A store whose final layer has 3 probe images' full spectra of length 5 (zero-padded to
    6), plus one noise image; ``exact=False``: randomized, no full spectrum."""
    rng = np.random.default_rng(0)
    full = np.zeros((2, 4, 6), np.float32)
    full[1, :, :5] = np.sort(rng.uniform(0.1, 2.0, (4, 5)), axis=-1)[..., ::-1]
    top = full[..., :3].copy()
    ds = xr.Dataset(
        {
            "singular_values": (("layer", "image", "rank"), top),
            "jer_pr": (("layer", "image"), np.ones((2, 4), np.float32)),
            "singular_values_full": (("layer", "image", "rank_full"), full),
            "n_singular": (("layer",), np.array([0, 5 if exact else 0], np.int64)),
        },
        coords={
            "layer": ["block00", "final"],
            "image": ["q0", "q1", "q2", "n0"],
            "probe_set": ("image", ["binding"] * 3 + ["noise"]),
            "rank": np.arange(3),
            "rank_full": np.arange(6),
        },
        attrs={"k": 3},
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The data type", category=UserWarning)
        write_store(path, ds, seed=0)
    return full[1, :3, :5].astype(float)


def test_full_spectrum_jer_is_the_mean_over_the_probe_images_of_the_whole_spectrum(
    tmp_path,
) -> None:
    spectra = full_store(tmp_path / "m.zarr")
    got = full_spectrum_jer(tmp_path / "m.zarr", "final", "binding")
    pr = [s.sum() ** 2 / (s**2).sum() for s in spectra]
    pr2 = [(s**2).sum() ** 2 / (s**4).sum() for s in spectra]
    assert got == pytest.approx({"pr_full": np.mean(pr), "pr2_full": np.mean(pr2)}, rel=1e-5)
    with pytest.raises(StoreError, match="no layer 'head'"):
        full_spectrum_jer(tmp_path / "m.zarr", "head", "binding")
    full_store(tmp_path / "r.zarr", exact=False)
    randomized = full_spectrum_jer(tmp_path / "r.zarr", "final", "binding")
    assert all(math.isnan(v) for v in randomized.values())


def test_run_record_and_arm_table(tmp_path) -> None:
    meta = {
        "final_loss_mean": 2.5,
        "jer_regulariser": {"weight": 0.0016, "sham": True, "steps_up": 140, "steps_down": 160},
    }
    write_json(tmp_path / "meta.json", meta)
    record = run_record(tmp_path / "meta.json")
    assert record == {"final_loss": 2.5, "weight": 0.0016, "steps_up": 140, "steps_down": 160}
    write_json(tmp_path / "plain.json", {"final_loss_mean": 2.0})
    assert run_record(tmp_path / "plain.json")["weight"] == 0.0
    write_json(tmp_path / "bad.json", {})
    with pytest.raises(StoreError, match="final_loss_mean"):
        run_record(tmp_path / "bad.json")
    table = pd.DataFrame(
        {
            "model": ["a", "b"],
            "binding_cosine": [0.4, 0.5],
            "binding_cosine_ci_low": [0.35, 0.45],
            "binding_cosine_ci_high": [0.45, 0.55],
            "same_different": [0.7, 0.8],
            "jer": [26.0, 27.0],
        }
    )
    cells = [
        {"base": "x", "dose": 0.3, "arm": "plain", "seed": 0, "model": "a"},
        {"base": "x", "dose": 0.3, "arm": "sham", "seed": 0, "model": "b"},
    ]
    arms = arm_table(cells, table, {"b": record}, "binding_cosine")
    assert arms["binding"].tolist() == [0.4, 0.5] and arms["binding_ci_low"].tolist() == [
        0.35,
        0.45,
    ]
    assert math.isnan(arms.loc[0, "final_loss"]) and arms.loc[1, "final_loss"] == 2.5
    with pytest.raises(StoreError, match="'c'"):
        arm_table([{**cells[0], "model": "c"}], table, {}, "binding_cosine")


def test_a_run_listed_for_two_cells_is_refused_naming_them() -> None:
    from repdiag.common.replication import ReplicationError

    arms = screen_losses(arms_frame(), 2.0)
    arms.loc[arms["model"] == "causal_1_sham_s1", "model"] = "causal_1_sham_s0"
    with pytest.raises(ReplicationError, match="causal_1 sham seed 0, causal_1 sham seed 1"):
        causal_contrasts(arms, 0.95)
