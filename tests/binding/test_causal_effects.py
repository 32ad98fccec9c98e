"""repdiag.binding.causal_effects: the causal test from its runs' files, end to end in process."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from repdiag.binding.analysis.aggregate import aggregate
from repdiag.binding.causal_effects import CausalFiles, causal_effects
from repdiag.core.store import write_json
from tests.binding.stats_fakes import SETTINGS, fake_models, model_paths, write_fake_results

ARMS = ("plain", "raise", "lower", "sham")
SEEDS = (0, 1, 2)


def test_the_arms_contrasts_and_summary_follow_from_the_files(tmp_path) -> None:
    models = fake_models(len(ARMS) * len(SEEDS))
    write_fake_results(tmp_path, models)
    metrics, jacobians = model_paths(tmp_path, models)
    keys = list(models)
    cells, zoo_meta = [], {}
    for i, key in enumerate(keys):
        arm, seed = ARMS[i % len(ARMS)], SEEDS[i // len(ARMS)]
        cells.append({"base": "b", "dose": 1.0, "arm": arm, "seed": seed, "model": key})
        zoo_meta[key] = tmp_path / "meta" / f"{key}.json"
        meta = {
            "objective": "supervised",
            "family": "binding_dose",
            "seed": seed,
            "steps": 300,
            "hparams": {"slot_weight": 1.0},
            "final_loss_mean": 2.0 + 0.01 * i,
            "learning": {"left_plateau": True, "slot_probe_gain": 0.1},
        }
        write_json(zoo_meta[key], meta)
    calibration = tmp_path / "calibration.csv"
    pilot = {"run": "b_raise_s0", "weight": 0.001, "n_steps": 12, "ratio_median": 0.2}
    pilot |= {"ratio_min": 0.1, "ratio_max": 0.3, "share_in_range": 1.0, "target": 0.2}
    pd.DataFrame([pilot | {"weight_for_target": 0.001}]).to_csv(calibration, index=False)
    files = CausalFiles(
        metrics={k: str(v) for k, v in metrics.items()},
        jacobians={k: str(v) for k, v in jacobians.items()},
        zoo_meta={k: str(v) for k, v in zoo_meta.items()},
        calibration=str(calibration),
    )

    result = causal_effects(models, files, cells, SETTINGS, loss_spread_sd=100.0)

    table = aggregate(models, metrics, jacobians, SETTINGS, zoo_meta).models.set_index("model")
    pd.testing.assert_frame_equal(result.models.set_index("model"), table)
    assert len(result.arms) == len(keys) and not result.arms["left_out"].any()
    # raise - sham in binding, per seed, from the per-model table: mean, t-interval and p
    binding = table[SETTINGS.binding_column]
    diffs = np.array([binding[keys[4 * s + 1]] - binding[keys[4 * s + 3]] for s in SEEDS])
    row = result.contrasts.query(
        "role == 'effect' and metric == 'binding' and arm == 'raise' and reference == 'sham'"
    ).iloc[0]
    assert row["n"] == len(SEEDS) and row["unit"] == "training run (seed)"
    assert row["mean"] == pytest.approx(diffs.mean())
    half = sps.t.ppf(0.5 + SETTINGS.confidence / 2, len(SEEDS) - 1) * sps.sem(diffs)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(
        (diffs.mean() - half, diffs.mean() + half)
    )
    assert row["p"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue)
    assert "raise" in result.summary and "b_raise_s0" in result.summary  # the pilot is shown
