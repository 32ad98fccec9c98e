"""The identifiability grid: cells from the config, what each cell uses, and running one cell.

A cell is one training run: generator x sampling condition x encoder kind x loss (x constrained
ratio for the support-corrected loss) x seed. Its name, used as the Snakemake wildcard and file
stem, reads ``identity-restricted-mlp-infonce-s0`` or
``identity-restricted-mlp-support_corrected-r0.50-s0``.

This module has no torch import at module level, so that the workflow can enumerate cells and
check the config without loading torch.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

from repdiag.core.errors import ConfigError

log = logging.getLogger(__name__)

SAMPLINGS = ("full", "restricted")
ENCODER_KINDS = ("mlp", "inverse")
LOSSES = ("infonce", "support_corrected")
CELL_PATTERN = re.compile(
    r"^(?P<generator>[a-z_]+)-(?P<sampling>full|restricted)-(?P<encoder>mlp|inverse)-"
    r"(?P<loss>infonce|support_corrected)(?:-r(?P<ratio>[0-9.]+))?-s(?P<seed>[0-9]+)$"
)


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    generator: str
    sampling: str
    encoder: str
    loss: str
    ratio: float | None
    seed: int

    @property
    def name(self) -> str:
        ratio = "" if self.ratio is None else f"-r{self.ratio:.2f}"
        return f"{self.generator}-{self.sampling}-{self.encoder}-{self.loss}{ratio}-s{self.seed}"


def parse_cell(name: str) -> Cell:
    """Inverse of :attr:`Cell.name`."""
    match = CELL_PATTERN.match(name)
    if not match:
        raise ConfigError(
            f"{name!r} is not an identifiability cell name (e.g. identity-full-mlp-infonce-s0)"
        )
    ratio = match["ratio"]
    return Cell(
        match["generator"],
        match["sampling"],
        match["encoder"],
        match["loss"],
        None if ratio is None else float(ratio),
        int(match["seed"]),
    )


def grid_cells(section: Mapping[str, Any]) -> list[Cell]:
    """Every cell of ``identifiability.grid`` and ``identifiability.ratio_sweep``, sorted, unique.

    In the main grid the support-corrected loss uses ratio 1 and only restricted sampling (with
    full support there is nothing to correct); the sweep runs restricted sampling at each ratio.
    """
    grid, sweep = section["grid"], section["ratio_sweep"]
    cells = set()
    for generator in grid["generators"]:
        for sampling in grid["samplings"]:
            for encoder in grid["encoders"]:
                for loss in grid["losses"]:
                    if loss == "support_corrected" and sampling == "full":
                        continue
                    ratio = 1.0 if loss == "support_corrected" else None
                    for seed in grid["seeds"]:
                        cells.add(Cell(generator, sampling, encoder, loss, ratio, seed))
    for generator in sweep["generators"]:
        for encoder in sweep["encoders"]:
            for ratio in sweep["ratios"]:
                for seed in sweep["seeds"]:
                    cells.add(
                        Cell(
                            generator,
                            "restricted",
                            encoder,
                            "support_corrected",
                            float(ratio),
                            seed,
                        )
                    )
    return sorted(cells)


CHECK_CONDITION = {"samplings": ["restricted"], "encoders": ["mlp"], "losses": ["infonce"]}
"""The cells of the like-for-like check: the MLP with diversity violated, plain InfoNCE."""


def check_section(section: Mapping[str, Any]) -> dict[str, Any]:
    """``section`` as the like-for-like check runs it (``identifiability.check``): its generators
    and seeds in :data:`CHECK_CONDITION`, at its steps and batch, with as many uniform negatives
    as anchors (the authors' batch), no ratio sweep; every other setting unchanged."""
    check = section.get("check") or {}
    batch = int(check.get("batch_size", 2000))
    return {
        **section,
        "train": {**section["train"], "steps": int(check.get("steps", 1000)), "batch_size": batch},
        "loss": {**section["loss"], "n_negatives": batch},
        "grid": {
            **CHECK_CONDITION,
            "generators": list(check.get("generators") or []),
            "seeds": list(check.get("seeds", [0, 1, 2, 3, 4])),
        },
        "ratio_sweep": {**section["ratio_sweep"], "generators": []},
    }


def cell_names(section: Mapping[str, Any]) -> list[str]:
    return [cell.name for cell in grid_cells(section)]


def cell_params(section: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Exactly the config values cell ``name`` uses, as plain data (the rule's ``params``).

    Keys a cell does not use (another generator's settings, n_fixed under full support, the
    MLP widths for an inverse model...) are left out so that changing them does not rerun it.
    """
    cell = parse_cell(name)
    generators = section["generators"]
    if cell.generator not in generators:
        raise ConfigError(
            f"identifiability.generators has no entry {cell.generator!r} (cell {name})"
        )
    encoders = section["encoders"]
    encoder: dict[str, Any] = {"kind": cell.encoder, "normalize": encoders["normalize"]}
    if cell.encoder == "mlp":
        mlp = encoders["mlp"]
        encoder |= {"variant": mlp["variant"], "hidden": list(mlp["hidden"]), "lr": mlp["lr"]}
        encoder["lr_schedule"] = mlp["lr_schedule"]
    else:
        encoder["lr"] = encoders["inverse"]["lr"]
        encoder["lr_schedule"] = encoders["inverse"]["lr_schedule"]
        train = dict(section["train"])
        if encoders["inverse"].get("steps") is not None:
            train["steps"] = encoders["inverse"]["steps"]
        if cell.generator == "patches":
            encoder["patches_sharpness"] = encoders["inverse"]["patches_sharpness"]
            encoder["patches_sharpness_start"] = encoders["inverse"]["patches_sharpness_start"]
    sampling: dict[str, Any] = {"kind": cell.sampling, "kappa": section["sampling"]["kappa"]}
    if cell.sampling == "restricted":
        sampling["n_fixed"] = section["sampling"]["n_fixed"]
    loss_section = section["loss"]
    loss: dict[str, Any] = {
        "kind": cell.loss,
        "similarity": loss_section["similarity"],
        "temperature": loss_section["temperature"],
        "n_negatives": loss_section["n_negatives"],
    }
    if cell.loss == "support_corrected":
        loss |= {"ratio": cell.ratio, "group_size": loss_section["group_size"]}
    return {
        "cell": name,
        "seed": cell.seed,
        "latent_dim": section["latent_dim"],
        "generator": {"name": cell.generator, "params": dict(generators[cell.generator])},
        "sampling": sampling,
        "encoder": encoder,
        "loss": loss,
        "train": train if cell.encoder == "inverse" else dict(section["train"]),
        "evaluation": dict(section["evaluation"]),
    }


def train_settings(params: Mapping[str, Any]) -> Any:
    """The :class:`ContrastiveSettings` of cell ``params`` (from :func:`cell_params`)."""
    from repdiag.identifiability.train import ContrastiveSettings

    sampling, loss, train = params["sampling"], params["loss"], params["train"]
    return ContrastiveSettings(
        steps=train["steps"],
        batch_size=train["batch_size"],
        log_every=train["log_every"],
        lr_schedule=params["encoder"]["lr_schedule"],
        lr=params["encoder"]["lr"],
        n_negatives=loss["n_negatives"],
        temperature=loss["temperature"],
        similarity=loss["similarity"],
        loss=loss["kind"],
        ratio=loss.get("ratio") or 0.0,
        group_size=loss.get("group_size", 1),
        sampling=sampling["kind"],
        kappa=sampling["kappa"],
        n_fixed=sampling.get("n_fixed", 1),
    )


def build_cell(params: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(settings, frozen generator, freshly initialised encoder) of cell ``params``, all from its seed."""
    from repdiag.identifiability.encoders import LatentEncoderSettings, build_latent_encoder
    from repdiag.identifiability.sphere import build_generator

    seed = params["seed"]
    generator = build_generator(
        params["generator"]["name"], params["latent_dim"], seed, **params["generator"]["params"]
    )
    spec = LatentEncoderSettings.of(params["encoder"])
    return train_settings(params), generator, build_latent_encoder(spec, generator, seed=seed)


def run_cell(
    params: Mapping[str, Any], device: str = "cpu"
) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    """Train cell ``params`` (from :func:`cell_params`) and evaluate R^2 / MCC / APE.

    Returns the result record (the cell JSON) and the loss curve [(step, loss)].
    Evaluation latents are drawn from ``evaluation.seed``, the same for every cell.
    """
    import numpy as np

    from repdiag.identifiability.metrics import HeldOutSettings, identifiability_metrics
    from repdiag.identifiability.sphere import sample_uniform
    from repdiag.identifiability.train import encode_latents, train_contrastive

    cell = parse_cell(params["cell"])
    settings, generator, encoder = build_cell(params)
    log.info(
        "cell %s: %d steps, batch %d on %s", cell.name, settings.steps, settings.batch_size, device
    )
    result = train_contrastive(encoder, generator, settings, seed=cell.seed, device=device)
    evaluation = HeldOutSettings.from_config(params["evaluation"])
    z = sample_uniform(
        evaluation.n_samples, params["latent_dim"], np.random.default_rng([evaluation.seed])
    )
    h = encode_latents(encoder, generator, z, device)
    metrics = identifiability_metrics(h, z, evaluation.train_fraction, evaluation.seed)
    log.info("cell %s: loss %.4f, %s", cell.name, result.final_loss, metrics)
    record = {
        **dataclasses.asdict(cell),
        "cell": cell.name,
        "metrics": metrics,
        "final_loss": result.final_loss,
        "steps": settings.steps,
        "batch_size": settings.batch_size,
        "wall_time_s": result.wall_time_s,
        "steps_per_s": result.steps_per_s,
        "device": str(device),
        "params": dict(params),
    }
    return record, result.curve


def check_identifiability_config(config: Mapping[str, Any]) -> None:
    """Semantic checks of ``identifiability`` (registered in ``repdiag.identifiability.config_checks()``)."""
    section = config.get("identifiability")
    if not section:
        return
    dim = section["latent_dim"]
    n_fixed = section["sampling"]["n_fixed"]
    if n_fixed > dim - 2:
        raise ConfigError(
            f"identifiability.sampling.n_fixed = {n_fixed} leaves no sub-sphere to perturb on "
            f"S^{dim - 1}: it must be <= latent_dim - 2 = {dim - 2}"
        )
    out_dim = section["generators"]["linear"]["out_dim"]
    if out_dim < dim:
        raise ConfigError(
            f"identifiability.generators.linear.out_dim = {out_dim} must be >= latent_dim = {dim} "
            "(an injective linear map cannot reduce the dimension)"
        )
    cells = grid_cells(section)
    if not cells:
        raise ConfigError("identifiability.grid and identifiability.ratio_sweep define no cell")
    group, batch = section["loss"]["group_size"], section["train"]["batch_size"]
    if any(c.loss == "support_corrected" for c in cells) and batch % group:
        raise ConfigError(
            f"identifiability.train.batch_size = {batch} must be a multiple of "
            f"identifiability.loss.group_size = {group} for the support-corrected loss"
        )
    for ratio in section["ratio_sweep"]["ratios"]:
        if abs(ratio * 100 - round(ratio * 100)) > 1e-9:
            raise ConfigError(
                f"identifiability.ratio_sweep.ratios: {ratio} has more than two decimals "
                "(cell names keep two)"
            )
    for key in ("grid.seeds", "ratio_sweep.seeds", "ratio_sweep.ratios"):
        first, second = key.split(".")
        values = section[first][second]
        if len(set(values)) != len(values):
            raise ConfigError(f"identifiability.{key} has duplicates: {values}")
