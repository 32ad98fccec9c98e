"""Extraction: exact features per image set, the store layout of docs/contracts.md, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from PIL import Image

from repdiag.core.errors import EncoderError, StoreError
from repdiag.core.store import open_store
from repdiag.encoders import build_encoder
from repdiag.encoders.embeddings import (
    extract_embeddings,
    extract_model,
    read_embeddings,
    write_embeddings,
)
from repdiag.encoders.preprocess import Preprocess, load_image_folder

torch.set_num_threads(1)

TOKEN_NET = {
    "source": "python",
    "id": "tests.encoders.custom_encoders:token_net",
    "family": "other",
    "kwargs": {"depth": 2},
}
N_Q, N_C, N_P, SIZE = 3, 4, 2, 16


def binding_like(rng: np.random.Generator) -> xr.Dataset:
    """The image variables and coordinates of results/datasets/binding.zarr (docs/contracts.md)."""
    image = ("y", "x", "channel")
    return xr.Dataset(
        {
            "query_image": (
                ("query", *image),
                rng.integers(0, 256, (N_Q, SIZE, SIZE, 3), dtype=np.uint8),
            ),
            "candidate_image": (
                ("query", "candidate", *image),
                rng.integers(0, 256, (N_Q, N_C, SIZE, SIZE, 3), dtype=np.uint8),
            ),
            "pair_image": (
                ("pair", "member", *image),
                rng.integers(0, 256, (N_P, 2, SIZE, SIZE, 3), dtype=np.uint8),
            ),
        },
        coords={
            "query": [f"q{i:05d}" for i in range(N_Q)],
            "candidate": np.arange(N_C),
            "pair": [f"p{i:05d}" for i in range(N_P)],
            "member": [0, 1],
            "channel": ["r", "g", "b"],
        },
    )


@pytest.fixture(scope="module")
def dataset() -> xr.Dataset:
    return binding_like(np.random.default_rng(0))


@pytest.fixture(scope="module")
def image_sets(dataset):
    from repdiag.binding.store import image_sets

    return image_sets(dataset)


def test_preprocess_closed_forms():
    pre = Preprocess(4, mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125), interpolation="nearest")
    constant = np.full((1, 2, 2, 3), 51, dtype=np.uint8)  # 51 / 255 = 0.2
    expected = (0.2 - np.array([0.1, 0.2, 0.3])) / np.array([0.5, 0.25, 0.125])
    out = pre(constant)
    assert out.shape == (1, 3, 4, 4) and out.dtype == torch.float32
    np.testing.assert_allclose(
        out[0].numpy(), np.broadcast_to(expected[:, None, None], (3, 4, 4)), rtol=1e-6
    )
    checker = np.array([[[0] * 3, [255] * 3], [[255] * 3, [0] * 3]], dtype=np.uint8)[None]
    nearest = Preprocess(4, mean=(0, 0, 0), std=(1, 1, 1), interpolation="nearest")(checker)[0, 0]
    np.testing.assert_array_equal(
        nearest.numpy(), np.kron([[0, 1], [1, 0]], np.ones((2, 2)))
    )  # each pixel 2x2
    smooth = Preprocess(4, mean=(0, 0, 0), std=(1, 1, 1), interpolation="bicubic")(checker)
    assert (
        float(smooth.min()) >= 0 and float(smooth.max()) <= 1
    )  # overshoot clamped like uint8 transforms
    with pytest.raises(
        EncoderError, match=r"preprocess expects images \(N, H, W, 3\), got shape \(2, 3, 4, 4\)"
    ):
        pre(np.zeros((2, 3, 4, 4), dtype=np.uint8))
    with pytest.raises(EncoderError, match="interpolation 'lanczos' is not one of"):
        Preprocess(4, interpolation="lanczos")


def test_extraction_is_exactly_the_encoder_features_in_the_contract_layout(image_sets):
    encoder = build_encoder("mine", TOKEN_NET)
    ds = extract_embeddings(encoder, image_sets, batch_size=5, device="cpu")
    n = N_Q + N_Q * N_C + 2 * N_P
    assert dict(ds.sizes) == {
        "image": n,
        "layer": 3,
        "dim_block00": 12,
        "dim_block01": 12,
        "dim_final": 12,
    }
    assert list(ds["layer"].values) == ["block00", "block01", "final"]
    assert ds["emb_final"].dims == ("image", "dim_final") and ds["emb_final"].dtype == np.float32
    assert list(ds["image"].values[:2]) == ["query/q00000", "query/q00001"]
    assert ds["image"].values[N_Q + N_C + 1] == "candidate/q00001/c1"
    assert list(ds["image"].values[-2:]) == ["pair/p00001/m0", "pair/p00001/m1"]
    assert list(np.unique(ds["image_set"].values)) == ["candidate", "pair", "query"]
    assert (
        ds.attrs["model"] == "mine"
        and ds.attrs["pooling"] == "cls"
        and ds.attrs["preprocess"]["input_size"] == 16
    )
    with torch.no_grad():
        everything = np.concatenate([images for _, images in image_sets.values()])
        direct = encoder.model(encoder.preprocess(everything)).numpy()
    np.testing.assert_allclose(ds["emb_final"].values, direct, rtol=1e-5, atol=1e-6)
    one_batch = extract_embeddings(encoder, image_sets, batch_size=64, device="cpu")
    np.testing.assert_allclose(
        one_batch["emb_block01"].values, ds["emb_block01"].values, rtol=1e-5, atol=1e-6
    )


def test_store_round_trip_and_read_embeddings_shapes(tmp_path, image_sets):
    encoder = build_encoder("mine", TOKEN_NET)
    ds = extract_embeddings(encoder, image_sets, batch_size=8, device="cpu")
    path = write_embeddings(tmp_path / "mine.zarr", ds, config={"models": {"mine": TOKEN_NET}})
    opened = xr.open_zarr(path)
    assert opened["emb_block00"].dims == ("image", "dim_block00") and opened["image_set"].dims == (
        "image",
    )
    assert opened.attrs["provenance"]["config"]["models"]["mine"]["id"] == TOKEN_NET["id"]
    query = read_embeddings(path, "final", "query")
    candidate = read_embeddings(path, "final", "candidate")
    pair = read_embeddings(path, "block00", "pair")
    assert (
        query.shape == (N_Q, 12)
        and candidate.shape == (N_Q, N_C, 12)
        and pair.shape == (N_P, 2, 12)
    )
    values = ds["emb_final"].values
    np.testing.assert_array_equal(candidate[1, 2], values[N_Q + 1 * N_C + 2])  # candidate/q00001/c2
    np.testing.assert_array_equal(pair[1, 0], ds["emb_block00"].values[-2])
    np.testing.assert_array_equal(read_embeddings(ds, "final", "query"), query)
    with pytest.raises(
        StoreError,
        match=r"has no array 'emb_block09'; its layers are \['block00', 'block01', 'final'\]",
    ):
        read_embeddings(path, "block09", "query")
    with pytest.raises(
        StoreError, match=r"has no images of set 'folder'; it has \['candidate', 'pair', 'query'\]"
    ):
        read_embeddings(path, "final", "folder")
    with pytest.raises(StoreError, match="does not exist: run the rule extract_embeddings"):
        read_embeddings(tmp_path / "absent.zarr", "final", "query")


def test_non_finite_features_are_refused(image_sets):
    encoder = build_encoder(
        "nan",
        {
            "source": "python",
            "id": "tests.encoders.custom_encoders:nan_net",
            "family": "other",
            "preprocess": {"input_size": 16},
        },
    )
    first_pixels = np.concatenate([images[:, 0, 0, 0] for _, images in image_sets.values()])
    dark = (first_pixels / 255 - 0.485) / 0.229 < 0
    with pytest.raises(
        EncoderError,
        match=rf"model 'nan': array 'emb_final' has {3 * dark.sum()} non-finite .* first in images \['",
    ) as err:
        extract_embeddings(encoder, image_sets, batch_size=64, device="cpu")
    assert "no store is written" in str(err.value)


def test_extract_model_embeds_the_sets_it_is_given_and_a_folder_set(tmp_path, image_sets):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    columns = np.tile(
        np.arange(32, dtype=np.uint8)[None, :, None] * 5, (16, 1, 3)
    )  # 32 wide, 16 high
    Image.fromarray(columns).save(folder / "wide.png")
    Image.fromarray(np.full((40, 20, 3), 200, dtype=np.uint8)).save(folder / "sub" / "tall.jpg")
    (folder / "notes.txt").write_text("not an image")
    ids, images = load_image_folder(folder, 16)
    assert ids == ["folder/sub/tall.jpg", "folder/wide.png"] and images.shape == (2, 16, 16, 3)
    np.testing.assert_array_equal(
        images[1, 0, :, 0], np.arange(8, 24) * 5
    )  # centre crop, no resize needed
    out = tmp_path / "embeddings" / "mine.zarr"
    extract_model(
        "mine",
        TOKEN_NET,
        out,
        image_sets={name: image_sets[name] for name in ("query", "pair")},
        folder=folder,
        batch_size=4,
        device="cpu",
        config={"models": {"mine": TOKEN_NET}},
    )
    stored = open_store(out, required=["emb_block00", "emb_final"])
    assert list(np.unique(stored["image_set"].values)) == ["folder", "pair", "query"]
    assert read_embeddings(out, "final", "folder").shape == (2, 12)
    with pytest.raises(EncoderError, match=r"image folder .* does not exist"):
        load_image_folder(tmp_path / "none", 16)


def test_extraction_runs_and_records_the_jacobian_stage_numerics(image_sets):
    """fp32 (the default, as jacobians.precision): TF32 off for matmuls and cuDNN convolutions
    during extraction, recorded in the store; torch's switches restored after it; bf16 runs
    under bfloat16 autocast (features close to float32's, not equal)."""
    from repdiag.core.gpu import numerics_record

    encoder = build_encoder("mine", TOKEN_NET)
    before = numerics_record()
    seen = {}
    real = encoder.layer_outputs

    def spy(x, names):
        seen.setdefault("tf32", numerics_record()["tf32"])
        seen.setdefault("autocast", torch.is_autocast_enabled("cpu"))
        return real(x, names)

    encoder.layer_outputs = spy
    ds = extract_embeddings(encoder, image_sets, batch_size=64, device="cpu")
    assert ds.attrs["precision"] == "fp32" and ds.attrs["numerics"]["precision_effective"] == "fp32"
    switches = {k: v for k, v in seen["tf32"].items() if k != "cudnn.fp32_precision"}
    assert switches and set(switches.values()) <= {"ieee", False} and not seen["autocast"]
    assert ds.attrs["numerics"]["tf32"] == seen["tf32"]
    assert numerics_record() == before
    seen.clear()
    bf16 = extract_embeddings(encoder, image_sets, batch_size=64, device="cpu", precision="bf16")
    assert seen["autocast"] and bf16.attrs["precision"] == "bf16"
    a, b = ds["emb_final"].values, bf16["emb_final"].values
    assert not np.array_equal(a, b)
    np.testing.assert_allclose(b, a, rtol=0.1, atol=0.1 * float(np.abs(a).max()))
