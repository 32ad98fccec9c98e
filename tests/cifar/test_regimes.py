"""The augmentation regimes: each changes only what its name says (repdiag.cifar.regimes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from repdiag.cifar.data import synthetic_images
from repdiag.cifar.regimes import AUGMENTATION_GROUPS, REGIMES, regime_settings
from repdiag.cifar.views import (
    augmentation,
)
from repdiag.core.config import schema_defaults

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "cifar.schema.yaml"
DEFAULTS = schema_defaults("cifar")["augment"]
ALWAYS = {**DEFAULTS, "jitter_p": 1.0, "grayscale_p": 0.5, "blur_p": 1.0, "flip_p": 0.5}
SEEDS = range(24)


def _image() -> torch.Tensor:
    """A fixed 32 px image with structure everywhere: a grating plus an asymmetric colour ramp."""
    grating = synthetic_images(1, 10, 32, seed=5).images[3].astype(np.float32) / 255
    ramp = np.linspace(0, 1, 32, dtype=np.float32)
    channels = [ramp[None, :] * ramp[:, None], ramp[None, :] ** 2, 1 - ramp[:, None]]
    image = 0.7 * grating + 0.3 * np.stack([np.broadcast_to(c, (32, 32)) for c in channels], -1)
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def _apply(regime: str, settings: dict, image: torch.Tensor, seed: int) -> torch.Tensor:
    transform = augmentation(regime, regime_settings(regime, settings), image.shape[-1])
    torch.manual_seed(seed)
    return transform(image)


def _colour_map(x: torch.Tensor) -> torch.Tensor:
    """A per-pixel affine colour map: channel permutation, scale and offset."""
    return 0.6 * x[[2, 0, 1]] + torch.tensor([0.1, 0.3, 0.05]).view(3, 1, 1)


def _commutes_with_colour_map(regime: str, settings: dict, seed: int) -> bool:
    x = _image()
    return torch.allclose(
        _apply(regime, settings, _colour_map(x), seed),
        _colour_map(_apply(regime, settings, x, seed)),
        atol=1e-5,
    )


def _commutes_with_rearrangements(regime: str, settings: dict, seed: int) -> bool:
    x = _image()
    flips = (lambda t: t.flip(-1), lambda t: t.flip(-2), lambda t: t.transpose(-1, -2))
    return all(
        torch.allclose(
            _apply(regime, settings, move(x), seed),
            move(_apply(regime, settings, x, seed)),
            atol=1e-5,
        )
        for move in flips
    )


@pytest.mark.parametrize("settings", [DEFAULTS, ALWAYS], ids=["defaults", "always"])
def test_crop_only_never_changes_colours(settings: dict) -> None:
    for seed in SEEDS:
        for colour in ((0.2, 0.5, 0.9), (1.0, 0.0, 0.3)):
            flat = torch.tensor(colour).view(3, 1, 1).expand(3, 32, 32).contiguous()
            out = _apply("crop_only", settings, flat, seed)
            assert torch.allclose(out, flat, atol=1e-6), (seed, colour)
        assert _commutes_with_colour_map("crop_only", settings, seed), seed
    moved = [not torch.equal(_apply("crop_only", settings, _image(), s), _image()) for s in SEEDS]
    assert all(moved)  # it does move pixels (a random resized crop is never the identity here)


@pytest.mark.parametrize("settings", [DEFAULTS, ALWAYS], ids=["defaults", "always"])
def test_no_crop_never_changes_geometry(settings: dict) -> None:
    marker = torch.full((3, 32, 32), 0.1)
    marker[:, 9, 21] = 1.0
    for seed in SEEDS:
        assert _commutes_with_rearrangements("no_crop", settings, seed), seed
        luma = _apply("no_crop", settings, marker, seed).mean(0)
        assert divmod(int(luma.argmax()), 32) == (9, 21), seed
    recoloured = [
        not torch.allclose(_apply("no_crop", ALWAYS, _image(), s), _image(), atol=1e-3)
        for s in SEEDS
    ]
    assert all(recoloured)  # it does change colours


def test_the_checks_fail_for_regimes_that_break_the_claim() -> None:
    """The two properties are not vacuous: the other regimes violate them."""
    assert not all(_commutes_with_rearrangements("crop_only", ALWAYS, s) for s in SEEDS)
    assert not all(_commutes_with_rearrangements("all", ALWAYS, s) for s in SEEDS)
    assert not all(_commutes_with_colour_map("no_crop", ALWAYS, s) for s in SEEDS)
    assert not all(_commutes_with_colour_map("all", ALWAYS, s) for s in SEEDS)


def test_regimes_read_exactly_their_groups_keys() -> None:
    geometric, photometric = AUGMENTATION_GROUPS["geometric"], AUGMENTATION_GROUPS["photometric"]
    assert set(geometric) | set(photometric) == set(DEFAULTS)
    assert tuple(regime_settings("crop_only", DEFAULTS)) == geometric
    assert tuple(regime_settings("no_crop", DEFAULTS)) == photometric
    assert tuple(regime_settings("all", DEFAULTS)) == geometric + photometric
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]["regimes"]
    assert sorted(schema["items"]["enum"]) == REGIMES.names()
    assert [REGIMES.get(n).label for n in ("all", "crop_only", "no_crop")] == [
        "All",
        "Crop only",
        "All w/o crop",
    ]
