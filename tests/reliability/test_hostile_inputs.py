"""Hostile but fair input files: weights of the wrong dtype or with NaN.

Weights named by a config are checked tensor by tensor when read: a bool, integer (where the
model has a float) or non-finite tensor is refused naming the tensor; float16/bfloat16 weights
are cast to float32 explicitly, and the cast is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from repdiag.core.errors import EncoderError
from repdiag.encoders.factory import build_encoder


def _resnet_state() -> dict[str, torch.Tensor]:
    import timm

    torch.manual_seed(0)
    return timm.create_model("resnet18", pretrained=False, num_classes=0).state_dict()


def _damage(state: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in state.items()}
    name = "conv1.weight"
    if how in ("bool", "int64", "int32"):
        out[name] = out[name].to(getattr(torch, how))
    elif how == "all bool":
        out = {k: v.to(torch.bool) if v.is_floating_point() else v for k, v in out.items()}
    elif how == "nan":
        out[name][0, 0, 0, 0] = float("nan")
    elif how == "inf":
        out["bn1.running_var"][3] = float("inf")
    elif how in ("float16", "bfloat16"):
        dtype = getattr(torch, how)
        out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
    return out


def _entry(source: str, path: Path) -> dict:
    if source == "checkpoint":
        return {"source": "checkpoint", "id": "resnet18", "family": "other",
                "weights": str(path), "kwargs": {"num_classes": 0}}  # fmt: skip
    return {"source": "timm", "id": "resnet18", "family": "supervised",
            "pretrained": str(path), "kwargs": {"num_classes": 0}}  # fmt: skip


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize(
    "source, suffix", [("checkpoint", ".safetensors"), ("timm", ".pth"), ("timm", ".safetensors")]
)
@pytest.mark.parametrize(
    "how, message",
    [
        ("bool", r"'conv1\.weight' has dtype torch\.bool"),
        ("all bool", r"has dtype torch\.bool"),
        ("int64", r"'conv1\.weight' has dtype torch\.int64"),
        ("int32", r"'conv1\.weight' has dtype torch\.int32"),
        ("nan", r"'conv1\.weight' holds 1 non-finite"),
        ("inf", r"'bn1\.running_var' holds 1 non-finite"),
    ],
)
def test_weights_of_a_wrong_dtype_or_non_finite_are_refused_naming_the_tensor(
    tmp_path: Path, source: str, suffix: str, how: str, message: str
) -> None:
    path = _save(_damage(_resnet_state(), how), tmp_path / f"w{suffix}")
    with pytest.raises(EncoderError, match=rf"model 'bad'.*{message}"):
        build_encoder("bad", _entry(source, path))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_weights_are_cast_to_float32_and_the_cast_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, dtype: str
) -> None:
    state = _damage(_resnet_state(), dtype)
    path = _save(state, tmp_path / "w.safetensors")
    with caplog.at_level(logging.WARNING, logger="repdiag.encoders.weights"):
        encoder = build_encoder("half", _entry("checkpoint", path))
    got = encoder.model.state_dict()
    assert got["conv1.weight"].dtype == torch.float32
    assert torch.equal(got["conv1.weight"], state["conv1.weight"].to(torch.float32))
    assert f"({dtype})" in caplog.text and "100 half-precision weights" in caplog.text


# --- image folders (case 7) ------------------------------------------------------------------


def _gradient(dtype, high: float):
    import numpy as np

    return (np.linspace(0, high, 16 * 16).reshape(16, 16)).astype(dtype)


@pytest.mark.parametrize(
    "kind",
    ["16-bit PNG", "16-bit PNG, dark", "float32 TIFF 0..1", "float32 TIFF 0..1000", "int32 TIFF"],
)
def test_16_bit_and_float_images_are_scaled_to_their_range(tmp_path: Path, kind: str) -> None:
    """PIL's convert("RGB") made these all white or all black; now they keep their gradient."""
    import numpy as np
    from PIL import Image

    from repdiag.encoders.preprocess import load_image_folder

    folder = tmp_path / "images"
    folder.mkdir()
    if kind.startswith("16-bit"):
        high = 65535 if kind == "16-bit PNG" else 4000
        Image.fromarray(_gradient(np.uint16, high)).save(folder / "a.png")
        expected_max = round(high / 65535 * 255)
    elif kind == "int32 TIFF":
        Image.fromarray(_gradient(np.int32, 10**6), mode="I").save(folder / "a.tif")
        expected_max = 255
    else:
        high = 1.0 if kind.endswith("0..1") else 1000.0
        Image.fromarray(_gradient(np.float32, high), mode="F").save(folder / "a.tif")
        expected_max = 255
    _, images = load_image_folder(folder, 16)
    assert images.dtype == np.uint8 and images.shape == (1, 16, 16, 3)
    assert images.min() <= 2, kind  # the dark end stays dark
    assert abs(int(images.max()) - expected_max) <= 3, (kind, images.max())
    assert len(np.unique(images)) > 8  # a gradient, not a constant


def test_an_image_over_the_pixel_budget_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A huge PNG raised PIL's DecompressionBombError without naming the file."""
    from PIL import Image

    from repdiag.encoders.preprocess import load_image_folder

    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (400, 300)).save(folder / "big.png")
    Image.new("RGB", (20, 20)).save(folder / "small.png")
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", "100000")
    with pytest.raises(
        EncoderError, match=r"big\.png is 400 x 300 = 120000 pixels, over the budget"
    ):
        load_image_folder(folder, 16)
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", "200000")
    ids, _ = load_image_folder(folder, 16)
    assert ids == ["folder/big.png", "folder/small.png"]


def test_a_decompression_bomb_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    from repdiag.encoders.preprocess import load_image_folder

    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("L", (600, 600)).save(folder / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL's own check, under ours
    monkeypatch.setenv("REPDIAG_MAX_IMAGE_PIXELS", str(10**9))
    with pytest.raises(EncoderError, match=r"bomb\.png"):
        load_image_folder(folder, 16)


# --- repdiag inspect on hostile stores (case 9) -------------------------------------------------


def _big_store(tmp_path: Path) -> Path:
    import numpy as np
    import xarray as xr

    from repdiag.core.store import write_store

    ds = xr.Dataset({"emb_final": (("image", "dim"), np.zeros((2048, 2048), dtype=np.float32))})
    encoding = {"emb_final": {"chunks": (128, 2048)}}
    return write_store(tmp_path / "big.zarr", ds, encoding=encoding)


def test_inspect_summarises_a_large_array_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole store was loaded (2.2 GB for a 35 KB store declaring 16384 x 16384)."""
    import tracemalloc

    from repdiag.core import inspect as repdiag_inspect

    path = _big_store(tmp_path)  # 16 MB of float32 zeros, a few KB on disk
    monkeypatch.setattr(repdiag_inspect, "READ_ELEMENTS", 1 << 18)
    tracemalloc.start()
    try:
        text = repdiag_inspect.describe_store(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "emb_final" in text and "min 0  mean 0  max 0" in text
    assert peak < 6 * 2**20, f"peak {peak / 2**20:.1f} MiB for a 16 MiB array"
    monkeypatch.setattr(repdiag_inspect, "CHUNK_BYTES_LIMIT", 2**16)
    assert "values not read: chunks of 1048576 bytes" in repdiag_inspect.describe_store(path)


def test_inspect_never_prints_bytes_of_a_file_outside_the_store(tmp_path: Path) -> None:
    import os

    from repdiag.core.errors import StoreError
    from repdiag.core.inspect import describe_store

    path = _big_store(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"SECRET-TOKEN-0123456789" * 10)
    chunk = next(
        p for p in (path / "emb_final").rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    chunk.unlink()
    os.symlink(secret, chunk)
    with pytest.raises(StoreError, match=r"emb_final/c/\S+ is a symbolic link; a store") as err:
        describe_store(path)  # refused from the listing, before anything is read
    message = str(err.value)
    assert "SECRET" not in message and "0123" not in message and "b'" not in message


# --- embedding stores against docs/contracts.md (case 5) ---------------------------------------


def _embeddings_store(tmp_path: Path, values) -> Path:
    import numpy as np
    import xarray as xr

    from repdiag.core.store import write_store

    n = len(values)
    ds = xr.Dataset(
        {"emb_final": (("image", "dim_final"), values)},
        coords={
            "image": np.array([f"query/q{i:05d}" for i in range(n)]),
            "image_set": ("image", np.array(["query"] * n)),
        },
    )
    return write_store(tmp_path / "m.zarr", ds)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("zeros", r"is the constant 0\.0 everywhere \(zero variance\)"),
        ("constant", r"is the constant 3\.5 everywhere"),
        ("int32", r"'emb_final' is int32 .*float32"),
        ("float64", r"'emb_final' is float64 .*float32"),
    ],
)
def test_embeddings_of_another_dtype_or_zero_variance_are_refused_naming_the_array(
    tmp_path: Path, kind: str, message: str
) -> None:
    """Valid checksums, wrong content: all-zero embeddings gave g_pr 0.0 with no warning."""
    import numpy as np

    from repdiag.core.errors import StoreError
    from repdiag.encoders.embeddings import read_embeddings

    values = {
        "zeros": np.zeros((6, 4), np.float32),
        "constant": np.full((6, 4), 3.5, np.float32),
        "int32": np.arange(24, dtype=np.int32).reshape(6, 4),
        "float64": np.random.default_rng(0).normal(size=(6, 4)),
    }[kind]
    path = _embeddings_store(tmp_path, values)
    with pytest.raises(StoreError, match=rf"m\.zarr.*{message}"):
        read_embeddings(path, "final", "query")


def test_constant_embedding_rows_are_flagged_by_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import numpy as np

    from repdiag.encoders.embeddings import read_embeddings

    values = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    values[2] = 0.0
    path = _embeddings_store(tmp_path, values)
    with caplog.at_level(logging.WARNING, logger="repdiag.encoders.embeddings"):
        out = read_embeddings(path, "final", "query")
    assert out.shape == (6, 4)
    assert "'emb_final' has 1 of 6 query rows constant" in caplog.text


def _jacobian_store(path: Path, dtype: str, dims: tuple[str, ...]) -> Path:
    import numpy as np
    import xarray as xr

    from repdiag.core.store import write_store

    sizes = {"layer": 2, "image": 3, "rank": 4}
    values = np.sort(np.random.default_rng(1).random([sizes[d] for d in dims]), axis=-1)
    jer = np.ones((2, 3), np.float32)
    ds = xr.Dataset(
        {"singular_values": (dims, values.astype(dtype)), "jer_pr": (("layer", "image"), jer)},
        coords={"layer": ["a", "b"], "image": ["i0", "i1", "i2"]},
    )
    return write_store(path, ds)


@pytest.mark.parametrize(
    ("dtype", "dims", "message"),
    [
        ("float64", ("layer", "image", "rank"), r"'singular_values' is float64"),
        ("int32", ("layer", "image", "rank"), r"'singular_values' is int32"),
        (
            "float32",
            ("image", "layer", "rank"),
            r"'singular_values' is float32 with dims \('image', 'layer', 'rank'\)",
        ),
    ],
)
def test_a_jacobian_store_of_another_dtype_or_dims_is_refused_naming_the_array(
    tmp_path: Path, dtype: str, dims: tuple[str, ...], message: str
) -> None:
    """Valid checksums, wrong contract: the analysis must not read it as spectra."""
    from repdiag.binding.analysis.depth import read_jacobians
    from repdiag.core.errors import StoreError

    good = _jacobian_store(tmp_path / "good.zarr", "float32", ("layer", "image", "rank"))
    assert read_jacobians(good, "pr")["singular_values"].dtype == "float32"
    bad = _jacobian_store(tmp_path / "m.zarr", dtype, dims)
    with pytest.raises(StoreError, match=rf"m\.zarr: array {message}.*docs/contracts\.md"):
        read_jacobians(bad, "pr")


def test_a_binding_dataset_with_float_images_is_refused_naming_the_array(tmp_path: Path) -> None:
    import numpy as np
    import xarray as xr

    from repdiag.binding.store import open_binding_store
    from repdiag.core.errors import StoreError
    from repdiag.core.store import write_store

    images = np.random.default_rng(2).random((2, 4, 4, 3))  # float64 in [0, 1], not uint8
    ds = xr.Dataset(
        {"query_image": (("query", "y", "x", "channel"), images)},
        coords={"query": ["q0", "q1"], "channel": ["r", "g", "b"]},
    )
    path = write_store(tmp_path / "binding.zarr", ds)
    with pytest.raises(StoreError, match=r"'query_image' is float64 .*uint8"):
        open_binding_store(path)
