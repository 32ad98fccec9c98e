"""Grid of the alignment study and the config values each job reads (no torch import here).

A *variant* is a method, or ``cosae-<ablation>`` for CoSAE. A synthetic *cell* is one variant at
one paired fraction and one seed, named ``<variant>__p<fraction>__s<seed>`` (e.g.
``cosae-all__p0.001__s0``). Variants that read no pairs (``independent``,
``cosae-distributional``) run once per seed with fraction 0: their training sees no pair at all.
Importable by the Snakefile and by rules in the analysis environment (no torch).

Testbed presets (``alignment.preset``, :data:`PRESETS`): a preset sets the difficulty keys of
``alignment.synthetic`` and the SAE width of ``alignment.sae`` over the values written there;
``none`` uses the sections as written. ``easy`` is the original testbed (exchangeable,
uncorrelated, all-shared concepts; SAE width and k as configured, 32 latents and k = 3 =
``k_active`` by default); ``hard`` has power-law concept frequencies, correlated concept pairs,
4 concepts private to each domain (16 shared + 8 private = 24), 4 active concepts per row and
a TopK SAE of 96 latents with k = 6 (wider than the concept count, k not the true sparsity).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from repdiag.core.errors import ConfigError

LOSS_TERMS = (
    "reconstruction",
    "translation",
    "consistency",
    "dist_translation",
    "dist_consistency",
)
ABLATIONS: dict[str, tuple[str, ...]] = {
    "translation": ("reconstruction", "translation"),
    "consistency": ("reconstruction", "consistency"),
    "distributional": ("reconstruction", "dist_translation", "dist_consistency"),
    "all": LOSS_TERMS,
}
PAIR_TERMS = ("translation", "consistency")
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "easy": {
        "synthetic": {"frequency_exponent": 0.0, "correlation": 0.0, "n_specific": 0},
        "sae": {},
    },
    "hard": {
        "synthetic": {
            "frequency_exponent": 1.0,
            "correlation": 0.5,
            "n_specific": 4,
            "k_active": 4,
        },
        "sae": {"n_latents": 96, "k": 6},
    },
    "none": {"synthetic": {}, "sae": {}},
}
PAIR_FREE_VARIANTS = ("independent", "cosae-distributional")
EXACT_VARIANT = "exact-translator"  # a control pair's exact translator (repdiag.alignment.study)
BASELINES = ("sae_a", "crosscoder", "usae")


def split_variant(variant: str) -> tuple[str, str | None]:
    """``"cosae-all" -> ("cosae", "all")``; ``"usae" -> ("usae", None)``."""
    method, _, ablation = variant.partition("-")
    return method, ablation or None


def variant_terms(variant: str) -> tuple[str, ...]:
    """The CoSAE loss terms a variant trains with (empty for the other methods)."""
    method, ablation = split_variant(variant)
    return ABLATIONS[ablation or "all"] if method == "cosae" else ()


def uses_pairs(variant: str) -> bool:
    return variant not in PAIR_FREE_VARIANTS


def grid_variants(grid: Mapping[str, Any]) -> list[str]:
    """Variants of the grid, in config order (CoSAE expanded over its ablations)."""
    variants = []
    for method in grid["methods"]:
        if method == "cosae":
            variants.extend(f"cosae-{ablation}" for ablation in grid["ablations"])
        else:
            variants.append(method)
    return variants


def format_fraction(fraction: float) -> str:
    return format(float(fraction), "g")


def cell_name(variant: str, fraction: float, seed: int) -> str:
    return f"{variant}__p{format_fraction(fraction)}__s{seed}"


def cell_variant(cell: str) -> str:
    """The variant of a cell name: ``"cosae-all__p0.001__s0" -> "cosae-all"``."""
    return cell.split("__", 1)[0]


def grid_cells(alignment: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every synthetic cell of the grid: name -> {variant, method, ablation, paired_fraction, seed}."""
    grid = alignment["grid"]
    cells = {}
    for seed in grid["seeds"]:
        for variant in grid_variants(grid):
            fractions = grid["paired_fractions"] if uses_pairs(variant) else [0.0]
            for fraction in fractions:
                method, ablation = split_variant(variant)
                cells[cell_name(variant, fraction, seed)] = {
                    "variant": variant,
                    "method": method,
                    "ablation": ablation,
                    "paired_fraction": float(fraction),
                    "seed": int(seed),
                }
    return cells


def _training_params(train: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """The training settings a variant reads (no SW directions without distributional terms)."""
    params = dict(train)
    if not any(term.startswith("dist_") for term in variant_terms(variant)):
        params.pop("sw_projections", None)
    if not uses_pairs(variant):
        params.pop("pair_batch_size", None)
    return params


def _weights(weights: Mapping[str, float], variant: str) -> dict[str, float] | None:
    terms = variant_terms(variant)
    return {term: float(weights[term]) for term in terms} if terms else None


def cell_params(alignment: Mapping[str, Any], cell: str) -> dict[str, Any]:
    """Exactly the config values one synthetic cell uses (the rule's ``params``)."""
    cells = grid_cells(alignment)
    if cell not in cells:
        raise ConfigError(f"alignment cell {cell!r} is not in the grid (alignment.grid)")
    spec = cells[cell]
    synthetic, sae = preset_sections(alignment)
    return {
        "cell": {"name": cell, **spec},
        "synthetic": synthetic,
        "sae": sae,
        "train": _training_params(alignment["train"], spec["variant"]),
        "weights": _weights(alignment["weights"], spec["variant"]),
        "evaluation": dict(alignment["evaluation"]),
    }


def tuning_enabled(alignment: Mapping[str, Any]) -> bool:
    """Whether grid cells train at the learning rate ``alignment.tuning`` picks per variant."""
    return bool((alignment.get("tuning") or {}).get("enabled", False))


def tuning_params(alignment: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """Exactly the config values the learning-rate selection of one variant uses."""
    if variant not in grid_variants(alignment["grid"]):
        raise ConfigError(f"alignment variant {variant!r} is not in the grid (alignment.grid)")
    synthetic, sae = preset_sections(alignment)
    tuning = {k: v for k, v in alignment["tuning"].items() if k != "enabled"}
    return {
        "variant": variant,
        "tuning": tuning,
        "synthetic": synthetic,
        "sae": sae,
        "train": _training_params(alignment["train"], variant),
        "weights": _weights(alignment["weights"], variant),
    }


def preset_sections(alignment: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``alignment.synthetic`` and ``alignment.sae`` with the preset's keys applied over them."""
    name = alignment.get("preset", "none")
    if name not in PRESETS:
        raise ConfigError(f"unknown alignment.preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    return (
        {**alignment["synthetic"], **preset["synthetic"]},
        {**alignment["sae"], **preset["sae"]},
    )


def real_pair_name(pair: Mapping[str, str]) -> str:
    """``<a>__<b>__<layer>``, with ``__<control>`` appended for a control pair."""
    name = f"{pair['a']}__{pair['b']}__{pair.get('layer', 'final')}"
    control = pair.get("control", "none")
    return name if control == "none" else f"{name}__{control}"


def real_pairs(alignment: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {real_pair_name(pair): dict(pair) for pair in alignment["real"]["pairs"]}


def real_params(alignment: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Exactly the config values one real-embedding pair job uses."""
    pairs = real_pairs(alignment)
    if name not in pairs:
        raise ConfigError(f"alignment real pair {name!r} is not in alignment.real.pairs")
    real = copy.deepcopy(dict(alignment["real"]))
    real.pop("pairs")
    weights = {v: _weights(alignment["weights"], v) for v in real["variants"]}
    return {
        "pair": pairs[name],
        **real,
        "weights": weights,
        "evaluation": dict(alignment["evaluation"]),
    }


# config checks ---------------------------------------------------------------------------------
def check_distinct_fractions(where: str, section: Mapping[str, Any]) -> None:
    """Paired fractions that stay distinct in cell names (``p<fraction:g>``): two that print the
    same would share one cell and one of them would silently not run."""
    seen: dict[str, float] = {}
    for fraction in section.get("paired_fractions") or []:
        name = format_fraction(fraction)
        if name in seen:
            raise ConfigError(
                f"{where}: {seen[name]!r} and {fraction!r} both name the cells p{name}; "
                "give fractions that differ in their first six significant digits"
            )
        seen[name] = fraction


def check_alignment_config(config: Mapping[str, Any]) -> None:
    """Cross-key checks of the ``alignment`` section (registered in repdiag.core.config)."""
    alignment = config.get("alignment") or {}
    if not alignment:
        return
    if "synthetic" in alignment and "sae" in alignment:
        synthetic, preset_sae = preset_sections(alignment)
    else:
        synthetic, preset_sae = alignment.get("synthetic", {}), alignment.get("sae", {})
    for where, section in (("grid", alignment.get("grid")), ("real", alignment.get("real"))):
        check_distinct_fractions(f"alignment.{where}.paired_fractions", section or {})
    real_sets = (alignment.get("real") or {}).get("image_sets") or []
    if "folder" in real_sets and not (config.get("embeddings") or {}).get("folder"):
        raise ConfigError(
            "alignment.real.image_sets: 'folder' needs embeddings.folder set (the embeddings "
            "have no folder image set without it)"
        )
    n_total = synthetic.get("n_concepts", 1) + 2 * synthetic.get("n_specific", 0)
    if synthetic.get("k_active", 1) > n_total:
        raise ConfigError(
            f"alignment.synthetic.k_active={synthetic['k_active']} exceeds the "
            f"{n_total} concepts of alignment.synthetic (n_concepts + 2 n_specific, "
            f"preset {alignment.get('preset', 'none')!r})"
        )
    tuning = alignment.get("tuning") or {}
    if tuning.get("enabled") and "n_train" in synthetic:
        from repdiag.alignment.concepts import n_paired_rows

        n_pairs = n_paired_rows(float(tuning.get("paired_fraction", 0.01)), synthetic["n_train"])
        if n_pairs < 2:
            raise ConfigError(
                f"alignment.tuning.paired_fraction={tuning.get('paired_fraction')} gives "
                f"{n_pairs} anchor pair of alignment.synthetic.n_train={synthetic['n_train']}; "
                "the validation split needs at least 2: raise the fraction"
            )
    for where in ("alignment.sae", "alignment.real.sae"):
        sae = preset_sae if where == "alignment.sae" else alignment.get("real", {}).get("sae", {})
        if sae and sae.get("k", 1) > sae.get("n_latents", 1):
            raise ConfigError(f"{where}.k={sae['k']} exceeds {where}.n_latents={sae['n_latents']}")
    models = config.get("models", {})
    seen = set()
    for index, pair in enumerate(alignment.get("real", {}).get("pairs", [])):
        for side in ("a", "b"):
            if pair[side] not in models:
                raise ConfigError(
                    f"alignment.real.pairs[{index}].{side}={pair[side]!r} is not a key of models; "
                    f"choose one of {', '.join(models)}"
                )
        if pair["a"] == pair["b"] and pair.get("control", "none") == "none":
            raise ConfigError(
                f"alignment.real.pairs[{index}] pairs model {pair['a']!r} with itself; "
                "set control: rotation for the positive control (b in a random basis) or "
                "control: shuffle for the negative one (b's training rows permuted)"
            )
        name = real_pair_name(pair)
        if name in seen:
            raise ConfigError(f"alignment.real.pairs[{index}] repeats the pair {name!r}")
        seen.add(name)
