"""Every entry of ``config/paper.yaml`` built with random weights through its real source.

timm and open_clip with ``pretrained`` off; torchvision with its weights enum, the file a random
state dict in a temporary torch.hub cache; hub entries from local hub directories written with the
upstream entry-point names and signatures (:mod:`tests.encoders.paper_hub`); hub and checkpoint
weights random files of the declared architecture and format, with the entry's prefix and
strictness. The entry's ``~/.cache/torch/hub`` paths are rewritten to temporary folders.

For each encoder: its taps (blocks or stages, ``final``, ``head`` where the model projects),
``final`` as wide as the model's pooled embedding before any projection (computed from the library
model and the architecture config, not from the taps), the last tap equal to what the model itself
returns, finite outputs at the entry's input size, and one randomized Jacobian spectrum of
``final`` (one image, k = 2; once per architecture, see ``SPECTRUM_AS``; a 64 px crop for the
fully convolutional ones, ``ANY_SIZE``). The ViT-L entries
(``META_ONLY``) are built on the meta device: their taps, widths and output shapes are checked,
their values on the ViT-B/S entry of the same library model class.
"""

from __future__ import annotations

import copy
import functools
import gc
import sys
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from repdiag.encoders import build_encoder
from repdiag.encoders.available import check_weights_available
from repdiag.encoders.entries import check_models
from repdiag.encoders.jacobian.engine import jacobian_spectra
from tests.encoders.jacobian.models import engine
from tests.encoders.paper_hub import UPSTREAM_ENTRY_POINTS, checkpoint_state, write_hub_dirs

torch.set_num_threads(1)

PAPER = Path(__file__).resolve().parents[2] / "config" / "paper.yaml"
CONFIG = yaml.safe_load(PAPER.read_text())
MODELS: dict[str, dict[str, Any]] = CONFIG["models"]
ENCODERS = [key for key, entry in MODELS.items() if entry.get("family") != "control"]
CONTROLS = [key for key, entry in MODELS.items() if entry.get("family") == "control"]
IMAGE_SIZE = CONFIG["datasets"]["binding"]["image_size"]
K = 2  # singular values of the one randomized spectrum per encoder
# The Jacobian engine runs once per architecture (library model class), on its smallest entry:
# another entry of the same class runs the same operations at another width, depth or patch
# size, so its spectrum (most of a ViT's test time on two cores) would test nothing new. Every
# entry is still built, tapped and run. ``architecture`` below checks each pair.
SPECTRUM_AS = {
    "mae_vit_b16": "dino_vit_s16",
    "mae_vit_l16": "dino_vit_s16",
    "dino_vit_b16": "dino_vit_s16",
    "vit_b16_supervised": "dino_vit_s16",
    "mocov3_vit_b16": "dino_vit_s16",
    "dinov2_vit_b14": "dinov2_vit_s14",
    "dinov2_vit_l14": "dinov2_vit_s14",
    "beitv2_vit_b16": "beit_vit_b16",
    "clip_vit_b16": "clip_vit_b32",
    "clip_vit_l14": "clip_vit_b32",
    "eva02_clip_l14": "eva02_clip_b16",
    "vicreg_rn50w2": "vicreg_rn50",
}

# Built on the meta device (architecture and shapes, no weights or values): each is the same
# library model class as an entry run in full (its ``SPECTRUM_AS`` representative), at a width
# and depth whose random initialisation and two forwards on one core were 40% of this module.
META_ONLY = ("mae_vit_l16", "dinov2_vit_l14", "clip_vit_l14", "eva02_clip_l14")
FULL = [key for key in ENCODERS if key not in META_ONLY]
# Fully convolutional entries (ResNets and ConvNeXt, global average pooling) take their spectrum
# on a 64 px crop of the 224 px image: no layer depends on the input size. CLIP's RN50 pools by
# attention over a 7 x 7 positional embedding, so it is not among them.
ANY_SIZE = ("convnext_b", "resnet50_supervised", "mocov3_rn50", "barlow_twins_rn50",
            "vicreg_rn50", "dino_rn50", "swav_rn50")  # fmt: skip


@functools.cache
def resolved_models() -> dict[str, dict[str, Any]]:
    """The entries as the workflow hands them to build_encoder (pooling from embeddings.pooling)."""
    config = copy.deepcopy(CONFIG)
    check_models(config)
    return config["models"]


def test_the_paper_lists_26_encoders_and_7_controls_that_pass_the_config_checks():
    assert len(ENCODERS) == 26 and len(CONTROLS) == 7
    resolved_models()  # names, sources, kwargs, hub and checkpoint fields
    for key in ENCODERS:
        entry = MODELS[key]
        if entry["source"] == "hub":
            checkout = Path(entry["repo"]).name
            assert entry["id"] in UPSTREAM_ENTRY_POINTS[checkout], (key, entry["id"])


@pytest.fixture(scope="module")
def hub_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    yield write_hub_dirs(root)
    for name, module in list(sys.modules.items()):  # the checkouts' sibling modules (resnet)
        if root in Path(getattr(module, "__file__", None) or "/").parents:
            del sys.modules[name]


BUILT: list[weakref.ref] = []  # the models built by the current test


@pytest.fixture(autouse=True)
def free_models():
    """Free a model that a reference cycle keeps alive (timm's ViTs after a forward) before the
    next entry: a full collection costs about a second in a worker, so only when one is left."""
    yield
    if any(ref() is not None for ref in BUILT):
        gc.collect()
    BUILT.clear()


@pytest.fixture(scope="module")
def entries() -> dict[str, dict[str, Any]]:
    return copy.deepcopy(resolved_models())


def offline_entry(
    entry: dict[str, Any], hub_dirs: dict[str, Path], tmp_path: Path
) -> tuple[dict[str, Any], Path | None]:
    """The entry with random weights: library weights off, hub/weights paths in ``tmp_path``.
    Returns the entry and the weights file still to be written (hub and checkpoint sources)."""
    entry = copy.deepcopy(entry)
    source, weights = entry["source"], None
    if source == "timm":
        entry["pretrained"] = False
    elif source == "open_clip":
        entry["pretrained"] = None
    elif source == "hub":
        entry["repo"] = str(hub_dirs[Path(entry["repo"]).name])
    if source in ("hub", "checkpoint"):
        weights = tmp_path / "checkpoints" / Path(entry["weights"]).name
        weights.parent.mkdir(parents=True, exist_ok=True)
        entry["weights"] = str(weights)
    return entry, weights


def write_weights(key: str, entry: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """A random weights file of the entry's architecture, in its format (.safetensors or a
    torch.save state dict): the architecture is the entry's own model built without weights."""
    import timm

    if entry["source"] == "checkpoint":
        model = timm.create_model(entry["id"], pretrained=False, **(entry.get("kwargs") or {}))
    else:
        model = build_encoder(key, {k: v for k, v in entry.items() if k != "weights"}).model
    state = checkpoint_state(model, entry)
    del model
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return state


def write_torchvision_cache(entry: dict[str, Any], hub_dir: Path) -> None:
    """A random state dict where torchvision's weights enum expects its file in the hub cache."""
    import torchvision

    weights = torchvision.models.get_model_weights(entry["id"])[entry["pretrained"]]
    model = torchvision.models.get_model(
        entry["id"], weights=None, num_classes=len(weights.meta["categories"])
    )
    path = hub_dir / "checkpoints" / Path(urlparse(weights.url).path).name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint_state(model, {}), path)


def expected_taps(
    entry: dict[str, Any], model: torch.nn.Module
) -> tuple[list[str], int, int | None]:
    """(block or stage names, width of the pooled embedding, projection width or None), from the
    library model and its architecture config, independently of the tap planner."""
    source = entry["source"]
    if source == "open_clip":
        import open_clip

        cfg = open_clip.get_model_config(entry["id"])
        vision, embed_dim = cfg["vision_cfg"], cfg["embed_dim"]
        if "timm_model_name" in vision:  # open_clip TimmModel: a timm trunk
            trunk = model.trunk
            # open_clip projects unless timm_proj is "none" (null: the trunk's classifier does)
            projects = vision.get("timm_proj", "linear") != "none"
            return (
                _names("block", len(trunk.blocks)),
                trunk.num_features,
                (embed_dim if projects else None),
            )
        if isinstance(vision["layers"], (list, tuple)):  # ModifiedResNet: attention pooling
            return _names("stage", 4, 1), embed_dim, None  # embeds straight into the joint space
        return _names("block", vision["layers"]), vision["width"], embed_dim
    if source in ("timm", "checkpoint"):
        if hasattr(model, "blocks"):
            names = _names("block", len(model.blocks))
        else:
            stages = len(model.stages) if hasattr(model, "stages") else 4  # ConvNeXt / ResNet
            names = _names("stage", stages, 1)
        width = getattr(model, "head_hidden_size", None) or model.num_features
        return names, width, (model.num_classes or None)
    # torchvision and torch.hub ResNets: the last bottleneck's width, fc when there is a Linear one
    width = model.layer4[-1].bn3.num_features
    fc = getattr(model, "fc", None)
    return (
        _names("stage", 4, 1),
        width,
        (fc.out_features if isinstance(fc, torch.nn.Linear) else None),
    )


def _names(prefix: str, count: int, digits: int = 2) -> list[str]:
    return [f"{prefix}{i:0{digits}d}" for i in range(count)]


def declared_size(entry: dict[str, Any]) -> int:
    kwargs = entry.get("kwargs") or {}
    return int(kwargs.get("img_size") or kwargs.get("image_size") or IMAGE_SIZE)


def architecture(entry: dict[str, Any]) -> tuple[str, str]:
    """The library code that builds ``entry``: timm's model module, open_clip's tower kind, the
    hub checkout, or the torchvision builder."""
    from timm.models._registry import _model_to_module

    source, name = entry["source"], entry["id"]
    if source in ("timm", "checkpoint"):
        return "timm", _model_to_module[name.split(".")[0]]
    if source == "open_clip":
        import open_clip

        vision = open_clip.get_model_config(name)["vision_cfg"]
        if "timm_model_name" in vision:
            return "open_clip timm", _model_to_module[vision["timm_model_name"]]
        return "open_clip", "resnet" if isinstance(vision["layers"], (list, tuple)) else "vit"
    if source == "hub":
        return "hub", Path(entry["repo"]).name
    return source, name


def test_spectra_skipped_only_where_the_same_architecture_has_one():
    for key, representative in SPECTRUM_AS.items():
        assert representative in ENCODERS and representative not in SPECTRUM_AS
        assert architecture(MODELS[key]) == architecture(MODELS[representative]), key
    for key in META_ONLY:  # library weights only: no weights file of ours goes unread
        assert key in SPECTRUM_AS and MODELS[key]["source"] in ("timm", "open_clip"), key


@pytest.mark.parametrize("key", FULL)
def test_paper_encoder_builds_with_random_weights(key, entries, hub_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "torch_hub"))
    entry, weights = offline_entry(entries[key], hub_dirs, tmp_path)
    if weights is not None:
        state = write_weights(key, entry, weights)
    if entry["source"] == "torchvision":
        write_torchvision_cache(entry, tmp_path / "torch_hub")
    check_weights_available({"models": {key: entry}})  # the run's onstart check passes
    encoder = build_encoder(key, entry)
    model = encoder.model
    BUILT.append(weakref.ref(model))
    if weights is not None:
        weights.unlink()  # up to 375 MB each: not kept in pytest's temporary folders
        # the file's weights, not the architecture's initialisation
        prefix = entry.get("state_dict_prefix") or ""
        name = next(k for k, v in model.state_dict().items() if v.is_floating_point())
        torch.testing.assert_close(model.state_dict()[name], state.pop(prefix + name))
        del state
    blocks, width, head = expected_taps(entry, model)
    # an MAE at random weights gets its decoder's input projection (repdiag.encoders.vit_shortcuts)
    mae = entry["source"] == "timm" and entry["id"].endswith(".mae")
    tail = ["projection"] if mae else ["head"] if head else []
    assert encoder.layers == [*blocks, "final", *tail]

    size = declared_size(entry)
    assert encoder.preprocess.input_size == size
    image = np.random.default_rng(0).integers(0, 256, (1, size, size, 3), dtype=np.uint8)
    x = encoder.preprocess(image)
    with torch.no_grad():
        out = encoder.layer_outputs(x)
        returned = model(x)
    assert all(bool(torch.isfinite(v).all()) for v in out.values())
    assert out["final"].shape == (1, width)
    if head:
        assert out["head"].shape == (1, head)
    if mae:
        assert out["projection"].shape == (1, 512)
    last = out["projection" if mae else "head" if head else "final"]  # the model's own output
    torch.testing.assert_close(last, returned.reshape(1, -1), rtol=1e-4, atol=1e-4)
    if key in SPECTRUM_AS:
        return

    if key in ANY_SIZE:  # the same convolutions and pooling on a 64 px crop, 1/12 the work
        x = x[..., :64, :64]
    spectra = jacobian_spectra(
        encoder, x, layers=["final"], **engine(method="randomized", k=K, power_iters=0, seed=0)
    )
    s = spectra["final"]
    assert spectra.methods["final"] == "randomized" and s.shape == (1, K)
    assert bool(torch.isfinite(s).all()) and bool((s > 0).all())
    assert bool((s[:, :-1] >= s[:, 1:]).all())  # sorted descending


@pytest.mark.parametrize("key", META_ONLY)
def test_large_paper_encoder_has_its_taps_and_widths_on_the_meta_device(key, entries):
    entry, _ = offline_entry(entries[key], {}, Path("unused"))
    encoder = build_encoder(key, entry, meta=True)
    blocks, width, head = expected_taps(entry, encoder.model)
    mae = entry["id"].endswith(".mae")
    tail = ["projection"] if mae else ["head"] if head else []
    assert encoder.layers == [*blocks, "final", *tail]
    size = declared_size(entry)
    assert encoder.preprocess.input_size == size
    x = encoder.preprocess(np.zeros((1, size, size, 3), dtype=np.uint8)).to("meta")
    with torch.no_grad():
        out = encoder.layer_outputs(x)
        returned = encoder.model(x)
    assert all(out[name].shape == (1, width) for name in [*blocks, "final"])  # ViTs: one width
    last = out["projection" if mae else "head" if head else "final"]  # the model's own output
    assert last.shape == returned.reshape(1, -1).shape == (1, 512 if mae else head or width)


@pytest.mark.parametrize("key", CONTROLS)
def test_paper_control_builds_at_the_paper_size(key, entries):
    """The controls (``source: python``) at 224 px, with the paper's own Jacobian settings: every
    ``final`` is narrow enough for ``auto`` to take the exact spectrum (reverse mode; the template
    matchers' ``grid_sample`` has no forward-mode derivative for ``randomized``). Their Jacobians
    are zero almost everywhere (hard thresholds), so only shape and finiteness are asserted."""
    encoder = build_encoder(key, entries[key])
    assert encoder.preprocess.input_size == declared_size(entries[key]) == IMAGE_SIZE
    assert encoder.layers == ["final"]
    image = np.random.default_rng(0).integers(0, 256, (1, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    x = encoder.preprocess(image)
    with torch.no_grad():
        final = encoder.layer_outputs(x)["final"]
    assert final.ndim == 2 and bool(torch.isfinite(final).all())
    settings = CONFIG["jacobians"]
    spectra = jacobian_spectra(
        encoder,
        x,
        layers=["final"],
        **engine(method=settings["method"], k=settings["k"], power_iters=settings["power_iters"]),
    )
    s = spectra["final"]
    assert spectra.methods["final"] == "exact" and s.shape == (1, final.shape[1])
    assert bool(torch.isfinite(s).all()) and bool((s >= 0).all())
