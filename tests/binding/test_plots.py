"""repdiag.binding.plots: figures from a small synthetic table are non-empty images of the expected size."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb

from repdiag.binding import plots
from repdiag.binding.dataset import BindingSettings, render_binding_dataset
from repdiag.common.figures import DPI, family_colour, save_figure
from repdiag.common.statistics import pearson

FAMILIES = [
    "variance_decorrelation",
    "masked_modeling",
    "vision_language",
    "supervised",
    "contrastive",
]


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    n = 7
    jer = rng.uniform(5, 30, n)
    models = pd.DataFrame(
        {
            "model": [f"m{i}" for i in range(n)],
            "family": [FAMILIES[i % len(FAMILIES)] for i in range(n)],
            "jer": jer,
            "g_iso": rng.uniform(0.2, 0.9, n),
            "g_pr": rng.uniform(0.1, 0.5, n),
            "l_iso_k5": rng.uniform(0.2, 0.9, n),
            "same_different": rng.uniform(0.5, 0.9, n),
            "chance": 0.125,
        }
    )
    models["binding"] = 0.1 + 0.01 * jer + rng.normal(0, 0.02, n)
    for readout, shift in (("cosine", 0.0), ("knn", 0.02), ("local_pca", -0.01)):
        models[f"binding_{readout}"] = models["binding"] + shift
        models[f"binding_{readout}_ci_low"] = models[f"binding_{readout}"] - 0.05
        models[f"binding_{readout}_ci_high"] = models[f"binding_{readout}"] + 0.05
        models[f"binding_{readout}_win"] = 0.5 + shift
    layers = ["block00", "block01", "block02", "final"]
    depth = pd.DataFrame(
        [
            {
                "model": m,
                "family": f,
                "layer": layer,
                "layer_index": i,
                "relative_depth": i / 3,
                "probe_set": "binding",
                "formula": "pr",
                "jer_mean": j * (1 - 0.1 * i),
                "jer_ci_low": j * (1 - 0.1 * i) - 1,
                "jer_ci_high": j * (1 - 0.1 * i) + 1,
            }
            for m, f, j in zip(models["model"], models["family"], jer, strict=True)
            for i, layer in enumerate(layers)
        ]
    )
    spectra = pd.DataFrame(
        [
            {
                "model": m,
                "family": f,
                "layer": "final",
                "layer_index": 3,
                "rank": k + 1,
                "sv_normalised": np.exp(-k / (j / 5)),
            }
            for m, f, j in zip(models["model"], models["family"], jer, strict=True)
            for k in range(16)
        ]
    )
    return models, depth, spectra


def check_image(png, fig_size_inches) -> np.ndarray:
    image = mpimg.imread(png)
    width, height = fig_size_inches
    assert image.shape[:2] == (round(height * DPI), round(width * DPI))
    rgb = image[..., :3]
    assert rgb.std() > 0.05  # not blank
    packed = (np.round(rgb * 255).astype(np.uint32) * [65536, 256, 1]).sum(axis=-1)
    assert len(np.unique(packed)) > 50  # text, markers and lines, not a flat fill
    return rgb


def save_and_check(fig, tmp_path, name):
    size = tuple(fig.get_size_inches())
    png, pdf = save_figure(fig, tmp_path / f"{name}.png", tmp_path / f"{name}.pdf")
    rgb = check_image(png, size)
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporaries
    return rgb


def has_colour(rgb: np.ndarray, hex_colour: str, tolerance: float = 0.02) -> bool:
    target = np.array(to_rgb(hex_colour))
    return bool((np.abs(rgb - target).max(axis=-1) < tolerance).any())


def test_scatter_grid(synthetic, tmp_path):
    models, _, _ = synthetic
    fig = plots.scatter_grid(
        models, ["g_pr", "g_iso", "l_iso_k5", "jer", "same_different"], chance=0.125
    )
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == 5
    texts = [t.get_text() for t in axes[3].texts]
    r, p, _ = pearson(models["jer"], models["binding"])
    assert any(f"r = {r:.2f}, p = {p:.2g}" in t for t in texts)
    assert axes[3].get_xlabel() == "JER (effective rank, directions)"
    assert "binding accuracy" in axes[3].get_ylabel()
    assert len(axes[3].lines) == 2  # fitted line and chance line
    rgb = save_and_check(fig, tmp_path, "scatter")
    for family in FAMILIES:
        assert has_colour(rgb, family_colour(family)), family


def test_scatter_grid_with_undefined_correlation(synthetic, tmp_path):
    models, _, _ = synthetic
    flat = models.assign(binding=0.125)
    fig = plots.scatter_grid(flat, ["jer"], ncols=1)
    assert "r undefined" in fig.axes[0].texts[0].get_text()
    save_and_check(fig, tmp_path, "flat")


def test_spectra_figure(synthetic, tmp_path):
    _, _, spectra = synthetic
    fig = plots.spectra_figure(spectra)
    ax = fig.axes[0]
    assert len(ax.lines) == spectra["model"].nunique()
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    first = ax.lines[0]
    assert first.get_color() == family_colour(spectra["family"].iloc[0])
    save_and_check(fig, tmp_path, "spectra")


def test_depth_figure(synthetic, tmp_path):
    _, depth, _ = synthetic
    fig = plots.depth_figure(depth, formula="pr", probe_set="binding")
    ax = fig.axes[0]
    assert len(ax.lines) == depth["model"].nunique()
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [0, 1 / 3, 2 / 3, 1])
    assert "relative depth" in ax.get_xlabel() and "JER" in ax.get_ylabel()
    save_and_check(fig, tmp_path, "depth")


def test_readout_figure(synthetic, tmp_path):
    models, _, _ = synthetic
    fig = plots.readout_figure(models, chance=0.125)
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * len(models)
    heights = sorted(round(p.get_height(), 9) for p in ax.patches)
    expected = sorted(
        round(v, 9) for r in ("cosine", "knn", "local_pca") for v in models[f"binding_{r}"]
    )
    assert heights == expected
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["chance (0.125)", "cosine", "kNN", "local PCA"]
    assert ax.get_ylabel() == "binding accuracy (fraction correct)"
    # the win rate below, its chance line at 1/2 (the synthetic table's win rates: 0.5 + shift)
    win = fig.axes[1]
    heights = sorted(round(p.get_height(), 9) for p in win.patches)
    expected = sorted(
        round(v, 9) for r in ("cosine", "knn", "local_pca") for v in models[f"binding_{r}_win"]
    )
    assert heights == expected
    assert win.get_legend() is None and win.lines[-1].get_ydata()[0] == 0.5
    assert "win rate" in win.get_ylabel()
    save_and_check(fig, tmp_path, "readouts")


def test_contact_sheet_is_a_png_with_the_correct_candidates_framed(tmp_path: Path) -> None:
    import matplotlib.image

    ds = render_binding_dataset(
        BindingSettings.from_config(dict(image_size=32, n_queries=3, n_candidates=8, n_pairs=8))
    )
    path = tmp_path / "sheet.png"
    plots.contact_sheet(ds, path, n_queries=3)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = (matplotlib.image.imread(path)[..., :3] * 255).round().astype(int)
    frame = np.all(np.abs(pixels - np.array([0, 158, 115])) <= 2, axis=-1)  # the green frame
    assert frame.sum() > 100
    pair_frame = np.all(np.abs(pixels - np.array([213, 94, 0])) <= 2, axis=-1)  # different pairs
    assert pair_frame.sum() > 100
    assert list(tmp_path.iterdir()) == [path]


def test_scatter_fit_is_over_objectives_with_their_seeds_averaged(tmp_path):
    from repdiag.binding.analysis.units import configuration
    from tests.binding.analysis.test_units import meta, row

    rng = np.random.default_rng(0)
    rows = []
    for objective, family in (
        ("simclr", "contrastive"),
        ("mae", "masked_modeling"),
        ("clip", "contrastive"),
    ):
        for seed in (0, 1):
            run = meta(objective, seed)
            assert configuration(run)
            rows.append(
                row(f"{objective}_s{seed}", family, run, jer=rng.normal(), binding=rng.random())
            )
    models = pd.DataFrame(rows)
    fig = plots.scatter_grid(models, ["jer"], ncols=1)
    means = models.groupby(models["model"].str[:-3])[["jer", "binding"]].mean()
    r, p, _ = pearson(means["jer"], means["binding"])
    text = fig.axes[0].texts[0].get_text()
    assert f"r = {r:.2f}, p = {p:.2g}" in text and "n = 3 objectives (6 runs)" in text
    save_and_check(fig, tmp_path, "units")


def test_scatter_fit_leaves_out_the_steps_saved_inside_a_run(tmp_path):
    """A step saved inside a run (save_at) is drawn hollow and never enters the fit: the text is
    the fit over the final networks alone, and a table with saved steps is not refused."""
    from tests.binding.analysis.test_units import meta, row

    rng = np.random.default_rng(1)
    finals, inside = [], []
    for objective in ("simclr", "mae", "clip"):
        for seed in (0, 1):
            run = meta(objective, seed)
            name = f"{objective}_s{seed}"
            finals.append(row(name, "contrastive", run, jer=rng.normal(), binding=rng.random()))
            inside.append(
                row(f"{name}-step100", "contrastive", run, 100, jer=9.0, binding=rng.random())
            )
    fig = plots.scatter_grid(pd.DataFrame(finals + inside), ["jer"], ncols=1)
    alone = plots.scatter_grid(pd.DataFrame(finals), ["jer"], ncols=1)
    text = fig.axes[0].texts[0].get_text()
    assert text == alone.axes[0].texts[0].get_text() and "(6 runs)" in text
    hollow = [c for c in fig.axes[0].collections if (c.get_facecolor()[:, 3] == 0).all()]
    assert len(hollow) == 1 and len(hollow[0].get_offsets()) == 6
    assert np.allclose(np.asarray(hollow[0].get_offsets())[:, 0], 9.0)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "step saved inside a run (not in the fit)" in labels
    save_and_check(fig, tmp_path, "saved_steps")
