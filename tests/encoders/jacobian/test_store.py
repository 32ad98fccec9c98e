"""The spectra store (repdiag.encoders.jacobian.store): the Dataset written from spectra, its
round trip, and the contract its readers check."""

from __future__ import annotations

import numpy as np

from repdiag.core.store import open_store, write_store
from repdiag.encoders.jacobian.jer import jer
from repdiag.encoders.jacobian.store import STORE_CONTRACT, spectra_dataset
from tests.encoders.jacobian.models import fake_spectra


def test_spectra_dataset_pads_top_k_keeps_full_exact_spectra_and_round_trips(tmp_path):
    ids = ["query/q00000", "noise/n00000", "noise/n00001"]
    ds = spectra_dataset(
        fake_spectra(), ids, ["binding", "noise", "noise"], k=2, formulas=["pr", "entropy"]
    )
    assert ds["singular_values"].dims == ("layer", "image", "rank")
    np.testing.assert_array_equal(
        ds["singular_values"].sel(layer="block00").values, [[3, 2], [1, 1], [2, 2]]
    )
    np.testing.assert_allclose(
        ds["jer_pr"].sel(layer="head").values, [49 / 25, 9 / 5, 1.0], rtol=1e-6
    )
    np.testing.assert_allclose(
        ds["jer_entropy"].values, jer(ds["singular_values"].values, "entropy").numpy(), rtol=1e-6
    )
    np.testing.assert_array_equal(ds["n_singular"].values, [3, 0])
    np.testing.assert_array_equal(ds["singular_values_full"].sel(layer="head").values, 0)
    assert ds.attrs["methods"] == {"block00": "exact", "head": "randomized"} and ds.attrs["k"] == 2

    write_store(tmp_path / "m.zarr", ds)
    back = open_store(tmp_path / "m.zarr", required=["singular_values", "jer_pr"])
    assert list(back["probe_set"].values) == ["binding", "noise", "noise"]
    assert list(back["image"].values) == ids and back.attrs["d_out"] == {"block00": 3, "head": 9}


def test_a_written_store_satisfies_the_contract_its_readers_check(tmp_path):
    """Every array of a store, as written, has the dtype and dims of STORE_CONTRACT."""
    ids = ["query/q00000", "noise/n00000", "noise/n00001"]
    ds = spectra_dataset(
        fake_spectra(), ids, ["binding", "noise", "noise"], k=2, formulas=["pr", "pr2", "entropy"]
    )
    assert set(ds.data_vars) == set(STORE_CONTRACT)
    write_store(tmp_path / "m.zarr", ds)
    back = open_store(tmp_path / "m.zarr", required=list(STORE_CONTRACT), contract=STORE_CONTRACT)
    for name, (dtype, dims) in STORE_CONTRACT.items():
        assert (str(back[name].dtype), back[name].dims) == (dtype, dims), name
