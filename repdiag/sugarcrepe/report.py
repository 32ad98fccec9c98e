"""SugarCrepe across models: the accuracy table, JER's partial correlation with accuracy given
zero-shot accuracy, the join into the models table, and the figure (no torch: analysis rules).

The binding paper's natural-image check: within the CLIP family, the Jacobian effective rank
(JER) predicts SugarCrepe accuracy even after controlling for zero-shot accuracy. Each model's JER
is given (the workflow reads it from ``results/jacobians/<model>.zarr`` as the binding study's
statistics stage does: ``stats.jer_formula`` at ``stats.jer_at`` over ``stats.probe_set``). The
partial correlation is ``repdiag.common.statistics.partial_correlation``:
r = corr(x - P_Z x, y - P_Z y), with Z = [1, zero-shot].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from repdiag.common import statistics as stats
from repdiag.common.figures import OKABE_ITO
from repdiag.common.tables import json_number
from repdiag.core.errors import ConfigError, StoreError
from repdiag.core.store import read_json
from repdiag.sugarcrepe.data import CATEGORIES

SUMMARIES = ("macro", "overall")
TABLE_COLUMNS = [
    "model",
    "category",
    "accuracy",
    "ci_low",
    "ci_high",
    "n",
    "zero_shot_accuracy",
    "hits",
    "ci_method",
    "family",
    "zero_shot_source",
    "jer",
]
ZERO_SHOT = "zero_shot_accuracy"
RESULT_KEYS = ("model", "family", "categories", "overall", "macro", "zero_shot")
CHANCE = 0.5  # two captions per image


def read_result(path: str | Path) -> dict[str, Any]:
    """Read ``results/sugarcrepe/<model>.json`` and check the keys the tables need."""
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"{path} does not exist: run rule sugarcrepe_score for that model")
    data = read_json(path)
    missing = [key for key in RESULT_KEYS if key not in data]
    if missing:
        raise StoreError(
            f"{path} lacks {missing}: it was not written by sugarcrepe_score; rerun it"
        )
    return data


def zero_shot_covariate(result: Mapping[str, Any], configured: float | None) -> tuple[float, str]:
    """The covariate of one model and where it comes from: computed on a labelled folder, else the
    config's ``models.<key>.covariates.zero_shot_accuracy``, else what the result recorded."""
    recorded = result["zero_shot"]
    if recorded.get("source") != "folder" and configured is not None:
        return float(configured), "config"
    value = json_number(recorded.get("accuracy"))
    return value, str(recorded.get("source", "missing")) if np.isfinite(value) else "missing"


def sugarcrepe_table(
    results: Sequence[Mapping[str, Any]],
    jer: Mapping[str, float],
    configured: Mapping[str, float | None] | None = None,
) -> pd.DataFrame:
    """One row per model and category (the categories, then ``macro`` and ``overall``).

    ``configured``: the config's zero-shot accuracy per model (see :func:`zero_shot_covariate`).
    """
    if not results:
        raise ConfigError(
            "sugarcrepe: no model was scored; list image-text models in sugarcrepe.models or add "
            "open_clip models to models"
        )
    rows = []
    for result in results:
        zero_shot, source = zero_shot_covariate(result, (configured or {}).get(result["model"]))
        parts = [*result["categories"].items(), *((name, result[name]) for name in SUMMARIES)]
        for category, record in parts:
            rows.append(
                {
                    "model": result["model"],
                    "category": category,
                    **{
                        key: record[key]
                        for key in ("accuracy", "ci_low", "ci_high", "n", "hits", "ci_method")
                    },
                    "zero_shot_accuracy": zero_shot,
                    "family": result["family"],
                    "zero_shot_source": source,
                    "jer": jer.get(result["model"], math.nan),
                }
            )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def targets(table: pd.DataFrame) -> list[str]:
    """The summaries, then the categories in SugarCrepe's order."""
    present = list(dict.fromkeys(table["category"]))
    ordered = [c for c in (*SUMMARIES, *CATEGORIES) if c in present]
    return ordered + [c for c in present if c not in ordered]


def wide(table: pd.DataFrame, category: str) -> pd.DataFrame:
    """One row per model: ``jer``, ``accuracy`` of ``category`` and the zero-shot covariate."""
    part = table[table["category"] == category]
    return part[["model", "family", "jer", "accuracy", "ci_low", "ci_high", ZERO_SHOT]].reset_index(
        drop=True
    )


def partial_correlations(table: pd.DataFrame, **options: Any) -> pd.DataFrame:
    """Per target: r(JER, accuracy) (no control) and the partial r given zero-shot accuracy.

    ``options``: the bootstrap and minimum-size options of
    :func:`repdiag.common.statistics.partial_table` (``n_boot``, ``seed``, ``confidence``,
    ``min_models``)."""
    frames = []
    for category in targets(table):
        models = wide(table, category)
        part = stats.partial_table(models, "jer", "accuracy", [[], [ZERO_SHOT]], **options)
        if models[ZERO_SHOT].isna().all():
            part.loc[part["controls"] == ZERO_SHOT, "note"] = (
                "no zero-shot accuracy: set sugarcrepe.zero_shot.folder or "
                "models.<key>.covariates.zero_shot_accuracy"
            )
        part.insert(0, "category", category)
        frames.append(part)
    return pd.concat(frames, ignore_index=True)


def join_models(models: pd.DataFrame, table: pd.DataFrame, headline: str) -> pd.DataFrame:
    """``models.csv`` plus ``sugarcrepe`` (the headline accuracy), its interval,
    ``sugarcrepe_<category>`` per category and summary, and ``sugarcrepe_zero_shot``; NaN for
    models not scored."""
    clash = [c for c in models.columns if c == "sugarcrepe" or c.startswith("sugarcrepe_")]
    if clash:
        raise StoreError(f"the models table already has SugarCrepe columns {clash}; rename them")
    scored = table.set_index(["model", "category"])
    out = models.copy()

    def column(category: str, field: str = "accuracy") -> list[float]:
        return [
            float(scored.loc[(m, category), field]) if (m, category) in scored.index else math.nan
            for m in out["model"]
        ]

    out["sugarcrepe"] = column(headline)
    out["sugarcrepe_ci_low"] = column(headline, "ci_low")
    out["sugarcrepe_ci_high"] = column(headline, "ci_high")
    for category in targets(table):
        out[f"sugarcrepe_{category}"] = column(category)
    out["sugarcrepe_zero_shot"] = column(headline, ZERO_SHOT)
    return out


# --------------------------------------------------------------------------- figure


def _result_text(row: pd.Series | None, what: str) -> str:
    if row is None or not np.isfinite(row["r"]):
        return f"{what}: n/a ({row['note'] if row is not None else 'not computed'})"
    return (
        f"{what} = {row['r']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}], "
        f"p = {row['p']:.3g}, n = {int(row['n'])}"
    )


def _partial_row(partial: pd.DataFrame, category: str, controls: str) -> pd.Series | None:
    rows = partial[(partial["category"] == category) & (partial["controls"] == controls)]
    return None if rows.empty else rows.iloc[0]


def sugarcrepe_figure(
    table: pd.DataFrame, partial: pd.DataFrame, headline: str, jer_label: str = "JER"
) -> Any:
    """(a) headline accuracy against JER, coloured by zero-shot accuracy, Wilson/normal intervals;
    (b) both residualised on zero-shot accuracy: the partial correlation's scatter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = wide(table, headline)
    x, y, z = (models[c].to_numpy(float) for c in ("jer", "accuracy", ZERO_SHOT))
    fig, (raw, resid) = plt.subplots(1, 2, figsize=(10.0, 4.4), layout="constrained")
    has_z = np.isfinite(z)
    yerr = np.vstack([y - models["ci_low"].to_numpy(float), models["ci_high"].to_numpy(float) - y])
    raw.errorbar(x, y, yerr=yerr, fmt="none", ecolor="#999999", elinewidth=0.8, zorder=2)
    if has_z.any():
        points = raw.scatter(
            x[has_z],
            y[has_z],
            c=z[has_z],
            cmap="cividis",
            s=40,
            edgecolor="black",
            linewidth=0.5,
            zorder=3,
        )
        fig.colorbar(points, ax=raw, label="zero-shot accuracy (fraction correct)")
    if (~has_z).any():
        raw.scatter(
            x[~has_z],
            y[~has_z],
            marker="x",
            color=OKABE_ITO[5],
            s=40,
            zorder=3,
            label="no zero-shot accuracy",
        )
    raw.axhline(CHANCE, color="#555555", linestyle=":", linewidth=1, label="chance (0.5)")
    raw.legend(loc="best", fontsize=8)
    for xi, yi, name in zip(x, y, models["model"], strict=True):
        raw.annotate(str(name), (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7)
    raw.set_xlabel(f"{jer_label} (effective rank, directions)")
    raw.set_ylabel(f"SugarCrepe {headline} accuracy (fraction correct)")
    raw.set_title(_result_text(_partial_row(partial, headline, ""), "r"), fontsize=8)

    row = _partial_row(partial, headline, ZERO_SHOT)
    complete = np.isfinite(x) & np.isfinite(y) & has_z
    if row is not None and np.isfinite(row["r"]):
        design = z[complete][:, None]
        rx, ry = stats.residualise(x[complete], design), stats.residualise(y[complete], design)
        resid.scatter(rx, ry, color=OKABE_ITO[4], s=40, edgecolor="black", linewidth=0.5, zorder=3)
        slope = np.polyfit(rx, ry, 1)[0] if len(rx) > 1 else 0.0
        line = np.linspace(rx.min(), rx.max(), 2)
        resid.plot(line, slope * line, color=OKABE_ITO[0], linewidth=1.2, label="least squares")
        for xi, yi, name in zip(rx, ry, models["model"][complete], strict=True):
            resid.annotate(
                str(name), (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7
            )
        resid.legend(loc="best", fontsize=8)
    else:
        resid.text(
            0.5,
            0.5,
            "partial correlation not computed",
            ha="center",
            va="center",
            transform=resid.transAxes,
        )
    resid.axhline(0, color="#555555", linewidth=0.6)
    resid.set_xlabel(f"{jer_label} | zero-shot accuracy (residual, directions)")
    resid.set_ylabel("accuracy | zero-shot accuracy (residual, fraction)")
    resid.set_title(_result_text(row, "partial r"), fontsize=8)
    fig.suptitle(f"JER and SugarCrepe ({headline}) controlling for zero-shot accuracy", fontsize=10)
    return fig
