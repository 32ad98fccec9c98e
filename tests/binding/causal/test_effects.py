"""repdiag.binding.causal.effects: the causal test from its runs' files, end to end in process."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import save_file
from scipy import stats as sps

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.causal.effects import CausalFiles, causal_effects
from repdiag.core.store import write_json
from tests.binding.stats_fakes import SETTINGS, fake_models, model_paths, write_fake_results

ARMS = ("plain", "raise", "sham", "null")
SEEDS = (0, 1, 2)


def test_the_arms_contrasts_displacement_and_summary_follow_from_the_files(tmp_path) -> None:
    models = fake_models(len(ARMS) * len(SEEDS))
    write_fake_results(tmp_path, models)
    metrics, jacobians = model_paths(tmp_path, models)
    keys = list(models)
    cells, zoo_meta, weights, pushes = [], {}, {}, {}
    for i, key in enumerate(keys):
        arm, seed = ARMS[i % len(ARMS)], SEEDS[i // len(ARMS)]
        cells.append({"base": "b", "dose": 0.3, "arm": arm, "seed": seed, "model": key})
        zoo_meta[key] = tmp_path / "meta" / f"{key}.json"
        meta = {
            "objective": "supervised",
            "family": "binding_dose",
            "seed": seed,
            "steps": 300,
            "hparams": {"slot_weight": 0.3},
            "final_loss_mean": 2.0 + 0.01 * i,
            "evaluation_losses": {"shape_presence": 0.2 + 0.001 * i},
            "learning": {"left_plateau": True, "slot_probe_gain": 0.1},
        }
        if arm != "plain":
            meta["jer_regulariser"] = {"weight": 1e-9 if arm == "null" else 0.5}
        write_json(zoo_meta[key], meta)
        # weights: plain of seed s at (s + 1, 0); each arm moved by (i, 1) from it; push along x
        weights[key] = str(tmp_path / f"{key}.safetensors")
        offset = np.zeros(2) if arm == "plain" else np.array([float(i), 1.0])
        save_file({"w": np.array([seed + 1.0, 0.0]) + offset}, weights[key])
        if arm != "plain":
            pushes[key] = str(tmp_path / f"{key}.push.safetensors")
            save_file({"w": np.array([2.0, 0.0])}, pushes[key])
    calibration = tmp_path / "calibration.csv"
    pilot = {"run": "b_raise_s0", "term": "jer", "n_steps": 12}
    pilot |= {"share_per_unit_weight_median": 1000.0, "share_per_unit_weight_p10": 500.0}
    pilot |= {"share_per_unit_weight_p90": 2000.0, "target": 0.5, "weight_for_target": 0.0005}
    pd.DataFrame([pilot]).to_csv(calibration, index=False)
    files = CausalFiles(
        metrics={k: str(v) for k, v in metrics.items()},
        jacobians={k: str(v) for k, v in jacobians.items()},
        zoo_meta={k: str(v) for k, v in zoo_meta.items()},
        weights=weights,
        pushes=pushes,
        calibration=str(calibration),
    )

    result = causal_effects(models, files, cells, SETTINGS)

    table = aggregate(models, metrics, jacobians, SETTINGS, zoo_meta).models.set_index("model")
    pd.testing.assert_frame_equal(result.models.set_index("model"), table)
    assert len(result.arms) == len(keys)  # intention to treat: every run
    # raise - plain in binding, per seed, from the per-model table: mean, t-interval and p
    binding = table[SETTINGS.binding_column]
    diffs = np.array([binding[keys[4 * s + 1]] - binding[keys[4 * s]] for s in SEEDS])
    row = result.contrasts.query(
        "family == 'primary' and metric == 'binding' and arm == 'raise'"
    ).iloc[0]
    assert row["n"] == len(SEEDS) and row["unit"] == "training run (seed)"
    assert row["reference"] == "plain" and row["mean"] == pytest.approx(diffs.mean())
    half = sps.t.ppf(0.5 + SETTINGS.confidence / 2, len(SEEDS) - 1) * sps.sem(diffs)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(
        (diffs.mean() - half, diffs.mean() + half)
    )
    assert row["p_t"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue)
    # displacement from the files: model i moved (i, 1) from its plain run, push along x
    arms = result.arms.set_index("model")
    for i, key in enumerate(keys):
        if i % len(ARMS):
            assert arms.loc[key, "along_push"] == pytest.approx(float(i))
            plain_norm = SEEDS[i // len(ARMS)] + 1.0
            assert arms.loc[key, "distance"] == pytest.approx(np.hypot(i, 1) / plain_norm)
    assert arms.loc[keys[1], "presence_loss"] == pytest.approx(0.201)
    moved = result.displacement.set_index("arm")
    assert set(moved.index) == {"raise", "sham", "null"}
    assert moved.loc["sham", "along_push_vs_raise"] == pytest.approx(
        np.mean([4 * s + 2 for s in SEEDS]) / np.mean([4 * s + 1 for s in SEEDS])
    )
    assert result.per_jer.iloc[0]["n"] == len(SEEDS)
    assert "b_raise_s0" in result.summary and "## Primary family" in result.summary
