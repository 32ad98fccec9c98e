"""A fabricated alignment grid for the report and figure tests."""

from __future__ import annotations

from repdiag.alignment.grid import split_variant
from repdiag.alignment.report import SUMMARY_COLUMNS


def fake_record(variant, fraction, seed, **metrics):
    method, ablation = split_variant(variant)
    summary = dict.fromkeys(SUMMARY_COLUMNS, 0.5)
    summary.update(sw_scale=1.0, sw_floor=0.01, sw_translation=0.01)
    summary.update(metrics)
    # the intervention metrics follow the secondary ones unless given
    if "tr_intervention" not in metrics:
        summary["tr_intervention"] = summary["tr_r2"]
    if "cont_intervention" not in metrics:
        summary["cont_intervention"] = summary["jaccard"]
    return {
        "cell": f"{variant}__p{fraction:g}__s{seed}",
        "variant": variant,
        "method": method,
        "ablation": ablation,
        "paired_fraction": fraction,
        "n_paired": int(fraction * 1000),
        "seed": seed,
        "summary": summary,
        "train": {"wall_time_s": 1.0},
    }


def fake_grid(cosae_ahead=True):
    records = []
    for seed in (0, 1, 2):
        jitter = 0.002 * seed
        records.append(
            fake_record(
                "independent", 0.0, seed, tr_r2=-1.0, jaccard=0.05, cycle_r2=0.3, sw_translation=0.2
            )
        )
        records.append(
            fake_record(
                "cosae-distributional",
                0.0,
                seed,
                tr_r2=-0.8,
                jaccard=0.1,
                cycle_r2=0.6,
                sw_translation=0.02,
            )
        )
        for fraction in (0.001, 1.0):
            records.append(
                fake_record(
                    "cosae-translation", fraction, seed, tr_r2=0.95 + jitter, jaccard=0.8 - jitter
                )
            )
            records.append(
                fake_record(
                    "cosae-consistency", fraction, seed, tr_r2=0.96 - jitter, jaccard=0.95 + jitter
                )
            )
            ours = 0.96 if cosae_ahead else 0.5
            records.append(
                fake_record("cosae-all", fraction, seed, tr_r2=ours + jitter, jaccard=ours - jitter)
            )
            records.append(fake_record("sae_a", fraction, seed, tr_r2=0.9, jaccard=0.85))
            records.append(fake_record("usae", fraction, seed, tr_r2=0.92, jaccard=0.7))
    return records
