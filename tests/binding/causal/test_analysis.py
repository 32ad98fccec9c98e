"""The JER intervention's analysis: per-seed contrasts against plain by intention to treat, with
t-intervals over seeds, t and exact sign-flip p and Holm's adjustment per family; the
displacement along each arm's push against a hand computation; binding per unit of JER; the
full-spectrum JER."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from repdiag.binding.causal.analysis import (
    arm_table,
    binding_per_jer,
    causal_contrasts,
    displacement,
    displacement_summary,
    full_spectrum_jer,
    plain_associations,
    run_record,
    seed_contrast,
    weight_displacements,
)
from repdiag.core.errors import StoreError
from repdiag.core.store import write_json, write_store

ARMS = ("plain", "null", "raise", "lower", "sham", "geometry")
SEEDS = tuple(range(6))
RNG = np.random.default_rng(7)
# binding per arm and seed: raise above plain at every seed, the others around it
SHIFT = {"plain": 0.0, "null": 0.002, "raise": 0.05, "lower": -0.01, "sham": 0.0, "geometry": 0.01}
PLAIN = 0.4 + 0.05 * RNG.standard_normal(len(SEEDS))
NOISE = {arm: 0.01 * RNG.standard_normal(len(SEEDS)) for arm in ARMS}


def binding_of(arm: str) -> np.ndarray:
    return PLAIN + SHIFT[arm] + (0 if arm == "plain" else NOISE[arm])


def arms_frame(base: str = "causal_0p3") -> pd.DataFrame:
    rows = []
    for arm in ARMS:
        for seed in SEEDS:
            b = float(binding_of(arm)[seed])
            rows.append(
                {
                    "base": base,
                    "dose": 0.3,
                    "arm": arm,
                    "seed": seed,
                    "model": f"{base}_{arm}_s{seed}",
                    "binding": b,
                    "binding_ci_low": b - 0.04,
                    "binding_ci_high": b + 0.04,
                    "same_different": 0.5 + b / 2,
                    "jer": 27.0 + {"raise": 2.0, "lower": -1.0}.get(arm, 0.0) + 0.1 * seed,
                    "pr_full": 30.0 + {"raise": 10.0}.get(arm, 0.0) + seed,
                    "pr2_full": 20.0 + {"raise": 40.0}.get(arm, 0.0),
                    "g_pr": 0.1 + {"geometry": 0.02}.get(arm, 0.0) + 0.001 * seed,
                    "g_iso": 0.5,
                    "l_iso_k10": 0.7 + 0.01 * seed,
                    "presence_loss": 0.2 + 0.01 * seed,
                    "distance": 0.0 if arm == "plain" else 0.1 + 0.01 * seed,
                    "along_push": {"plain": 0.0, "null": 1e-9}.get(arm, 0.5 + 0.01 * seed),
                    "update_share": math.nan if arm == "plain" else 0.5,
                }
            )
    return pd.DataFrame(rows)


def test_the_contrast_is_the_t_interval_of_the_per_seed_differences_with_t_and_exact_p() -> None:
    arms = arms_frame()
    row = seed_contrast(arms, "binding", "raise", "plain", 0.95)
    diffs = binding_of("raise") - binding_of("plain")
    n, mean, sd = len(SEEDS), diffs.mean(), diffs.std(ddof=1)
    half = sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert (row["n"], row["mean"], row["sd"]) == (n, pytest.approx(mean), pytest.approx(sd))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((mean - half, mean + half))
    assert row["p_t"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue)
    # exact: every one of the 2^6 sign assignments, enumerated here
    stats = [abs(np.mean(np.multiply(s, diffs))) for s in itertools.product((1, -1), repeat=n)]
    assert row["p_exact"] == pytest.approx(np.mean(np.array(stats) >= abs(mean) - 1e-12))
    assert row["p_exact"] == pytest.approx(2 / 2**n)  # every difference positive: the floor
    assert row["unit"] == "training run (seed)" and row["seeds"] == "0 1 2 3 4 5"


def test_intention_to_treat_keeps_every_run_and_names_a_seed_without_its_arm() -> None:
    """No screen: a run whose loss is far off stays in; a seed that lacks an arm is named."""
    arms = arms_frame()
    arms.loc[(arms["arm"] == "lower") & (arms["seed"] == 3), "presence_loss"] = 9.0
    row = seed_contrast(arms, "binding", "lower", "plain", 0.95)
    assert row["n"] == len(SEEDS) and row["seeds_missing"] == ""
    short = arms[~((arms["arm"] == "lower") & (arms["seed"] == 2))]
    row = seed_contrast(short, "binding", "lower", "plain", 0.95)
    assert row["n"] == len(SEEDS) - 1 and row["seeds_missing"] == "2"


def test_families_are_holm_adjusted_apart_and_the_floor_and_matrix_are_in_none() -> None:
    table = causal_contrasts(arms_frame(), 0.95)
    primary = table[table["family"] == "primary"]
    assert set(zip(primary["arm"], primary["reference"], strict=True)) == {
        (arm, "plain") for arm in ("raise", "lower", "sham", "geometry")
    }
    assert set(primary["metric"]) == {"binding", "same_different"}
    assert len(primary) == 8 and (primary["family_size"] == 8).all()
    # Holm by hand over the 8 exact p
    p = primary["p_exact"].to_numpy(float)
    order = np.argsort(p, kind="stable")
    expected = np.empty(8)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (8 - rank) * p[index]))
        expected[index] = running
    assert primary["p_holm"].to_numpy(float) == pytest.approx(expected)
    secondary = table[table["family"] == "secondary"]
    assert len(secondary) == 6 and (secondary["family_size"] == 6).all()
    floor = table[table["family"] == "floor"]
    assert set(floor["arm"]) == {"null"} and floor["p_holm"].isna().all()
    matrix = table[table["family"] == "manipulation"].set_index(["metric", "arm"])
    assert {"jer", "pr_full", "pr2_full", "g_pr", "g_iso", "l_iso_k10", "presence_loss"} <= set(
        matrix.index.get_level_values("metric")
    )
    assert matrix.loc[("jer", "raise"), "mean"] == pytest.approx(2.0)
    assert matrix.loc[("g_pr", "geometry"), "mean"] == pytest.approx(0.02)
    assert matrix.loc[("pr2_full", "raise"), "sd"] == 0.0  # a constant difference
    assert ("jer", "null") in matrix.index


def test_arms_without_lower_and_geometry_compare_what_they_have() -> None:
    arms = arms_frame().query("arm not in ['lower', 'geometry']")
    table = causal_contrasts(arms, 0.95)
    assert not {"lower", "geometry"} & (set(table["arm"]) | set(table["reference"]))
    primary = table[table["family"] == "primary"]
    assert len(primary) == 4 and (primary["family_size"] == 4).all()  # raise, sham x 2 metrics
    assert len(table[table["family"] == "secondary"]) == 2  # raise - sham only


def test_displacement_against_a_hand_computation() -> None:
    plain = {"a": np.array([[1.0, 2.0]]), "b": np.array([3.0]), "bn.running_mean": np.ones(2)}
    arm = {"a": np.array([[1.5, 2.0]]), "b": np.array([1.0]), "bn.running_mean": np.zeros(2)}
    push = {"a": np.array([[3.0, 0.0]]), "b": np.array([-4.0])}
    got = displacement(arm, plain, push)
    delta = np.array([0.5, 0.0, -2.0])
    assert got["distance"] == pytest.approx(np.linalg.norm(delta) / math.sqrt(14.0))
    assert got["along_push"] == pytest.approx((0.5 * 3 + 2 * 4) / 5.0)
    assert got["push_norm"] == pytest.approx(5.0)
    with pytest.raises(StoreError, match="missing"):
        displacement({"a": arm["a"]}, plain, push)


def test_weight_displacements_read_the_files_against_the_plain_run_of_the_seed(tmp_path) -> None:
    from safetensors.numpy import save_file

    def put(name, tensors):
        save_file({k: np.asarray(v, np.float32) for k, v in tensors.items()}, str(tmp_path / name))
        return str(tmp_path / name)

    cells = [
        {"base": "b", "arm": "plain", "seed": 0, "model": "p0"},
        {"base": "b", "arm": "raise", "seed": 0, "model": "r0"},
        {"base": "b", "arm": "plain", "seed": 1, "model": "p1"},
        {"base": "b", "arm": "raise", "seed": 1, "model": "r1"},
    ]
    weights = {
        "p0": put("p0", {"w": [1.0, 0.0]}),
        "r0": put("r0", {"w": [2.0, 0.0]}),
        "p1": put("p1", {"w": [0.0, 1.0]}),
        "r1": put("r1", {"w": [0.0, 3.0]}),
    }
    pushes = {"r0": put("pr0", {"w": [1.0, 0.0]}), "r1": put("pr1", {"w": [0.0, -2.0]})}
    moved = weight_displacements(cells, weights, pushes)
    assert moved["p0"] == {"distance": 0.0, "along_push": 0.0, "push_norm": 0.0}
    assert moved["r0"]["along_push"] == pytest.approx(1.0)
    assert moved["r1"]["along_push"] == pytest.approx(-2.0)  # against its push, from plain s1
    assert moved["r1"]["distance"] == pytest.approx(2.0)
    with pytest.raises(StoreError, match=r"no push\.safetensors for 'r1'"):
        weight_displacements(cells, weights, {"r0": pushes["r0"]})


def test_displacement_summary_reads_sham_and_geometry_against_raise_and_all_against_null() -> None:
    arms = arms_frame()
    arms.loc[arms["arm"] == "sham", "along_push"] *= 0.5
    summary = displacement_summary(arms, 0.95).set_index("arm")
    assert "plain" not in summary.index
    raise_mean = arms.loc[arms["arm"] == "raise", "along_push"].mean()
    assert summary.loc["sham", "along_push_vs_raise"] == pytest.approx(0.5)
    assert summary.loc["sham", "matched"] is False or not summary.loc["sham", "matched"]
    assert bool(summary.loc["geometry", "matched"])
    assert summary.loc["raise", "along_push"] == pytest.approx(raise_mean)
    assert summary.loc["raise", "distance_vs_null"] == pytest.approx(1.0)


def test_binding_per_jer_is_the_ratio_of_the_mean_changes_with_a_seed_bootstrap() -> None:
    arms = arms_frame()
    row = binding_per_jer(arms, n_boot=500, seed=1, confidence=0.95).iloc[0]
    d_binding = binding_of("raise") - binding_of("plain")
    d_jer = np.full(len(SEEDS), 2.0)
    assert row["binding_per_jer"] == pytest.approx(d_binding.mean() / 2.0)
    assert row["jer_change"] == pytest.approx(2.0) and row["n"] == len(SEEDS)
    # the constant JER change: the interval is that of the mean binding change, over 2
    rng = np.random.default_rng(1)
    draws = rng.integers(0, len(SEEDS), size=(500, len(SEEDS)))
    ratios = d_binding[draws].mean(1) / d_jer[draws].mean(1)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(
        (np.quantile(ratios, 0.025), np.quantile(ratios, 0.975))
    )


def test_plain_associations_are_across_the_plain_runs_only() -> None:
    arms = arms_frame()
    table = plain_associations(arms, 0.95, 200, 0).set_index("metric")
    plain = arms[arms["arm"] == "plain"]
    r = sps.pearsonr(plain["jer"], plain["binding"]).statistic
    assert table.loc["jer", "pearson_r"] == pytest.approx(r)
    assert table.loc["jer", "n"] == len(SEEDS)


def full_store(path, exact: bool = True, values=None) -> np.ndarray:
    """A store whose final layer has 3 probe images' full spectra of length 5 (zero-padded to
    6; ``values``: every image's), plus one noise image; ``exact=False``: randomized, no full
    spectrum."""
    rng = np.random.default_rng(0)
    full = np.zeros((2, 4, 6), np.float32)
    full[1, :, :5] = np.sort(rng.uniform(0.1, 2.0, (4, 5)), axis=-1)[..., ::-1]
    if values is not None:
        full[1, :, :5] = values
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
    # a rank-2 map among them: its zero value adds nothing, (3 + 1)^2 / 10 and 100 / 82
    spectra = full_store(tmp_path / "z.zarr", values=[3.0, 1.0, 0.0, 0.0, 0.0])
    got = full_spectrum_jer(tmp_path / "z.zarr", "final", "binding")
    assert got == pytest.approx({"pr_full": 16 / 10, "pr2_full": 100 / 82}, rel=1e-6)
    full_store(tmp_path / "r.zarr", exact=False)
    randomized = full_spectrum_jer(tmp_path / "r.zarr", "final", "binding")
    assert all(math.isnan(v) for v in randomized.values())


def test_run_record_and_arm_table(tmp_path) -> None:
    meta = {
        "final_loss_mean": 2.5,
        "evaluation_losses": {"shape_presence": 0.21, "slot_shape": 1.3},
        "jer_regulariser": {
            "weight": 0.00034,
            "term": "direction_sham",
            "steps_acted": 300,
            "update_share_median": 0.48,
        },
    }
    write_json(tmp_path / "meta.json", meta)
    record = run_record(tmp_path / "meta.json")
    assert record == {
        "final_loss": 2.5,
        "presence_loss": 0.21,
        "weight": 0.00034,
        "term": "direction_sham",
        "steps_acted": 300,
        "update_share": 0.48,
    }
    write_json(tmp_path / "plain.json", {"final_loss_mean": 2.0})
    plain = run_record(tmp_path / "plain.json")
    assert plain["weight"] == 0.0 and math.isnan(plain["presence_loss"])
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
            "g_pr": [0.1, 0.2],
            "g_iso": [0.5, 0.6],
            "l_iso_k5": [0.7, 0.8],
        }
    )
    cells = [
        {"base": "x", "dose": 0.3, "arm": "plain", "seed": 0, "model": "a"},
        {"base": "x", "dose": 0.3, "arm": "sham", "seed": 0, "model": "b"},
    ]
    arms = arm_table(cells, table, {"b": record}, "binding_cosine")
    assert arms["binding"].tolist() == [0.4, 0.5] and arms["g_pr"].tolist() == [0.1, 0.2]
    assert arms["l_iso_k5"].tolist() == [0.7, 0.8]
    assert math.isnan(arms.loc[0, "final_loss"]) and arms.loc[1, "final_loss"] == 2.5
    with pytest.raises(StoreError, match="'c'"):
        arm_table([{**cells[0], "model": "c"}], table, {}, "binding_cosine")


def test_a_run_listed_for_two_cells_is_refused_naming_them() -> None:
    from repdiag.common.units import ReplicationError

    arms = arms_frame()
    arms.loc[arms["model"] == "causal_0p3_sham_s1", "model"] = "causal_0p3_sham_s0"
    with pytest.raises(ReplicationError, match="causal_0p3 sham seed 0, causal_0p3 sham seed 1"):
        causal_contrasts(arms, 0.95)
