"""repdiag.contracts: docs/contracts.md's store tables are the contracts the readers check."""

from __future__ import annotations

import pytest

from repdiag import contracts
from repdiag.binding.dataset import CONTRACT, BindingSettings, render_binding_dataset


def test_the_page_is_up_to_date():
    assert contracts.main(["--check"]) == 0, "run: .venv/bin/python -m repdiag.contracts"


def test_every_array_of_every_contract_is_a_row_with_its_dims_and_dtype():
    for name, (module, attribute) in contracts.STORES.items():
        rows = contracts.block(name).splitlines()[2:]
        contract = getattr(__import__(module, fromlist=[attribute]), attribute)
        assert len(rows) == len(contract)
        for row, (array, (dtype, dims)) in zip(rows, contract.items(), strict=True):
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            assert cells[:3] == [f"`{array}`", f"({', '.join(dims)})", dtype]


def test_the_binding_contract_is_what_the_renderer_writes():
    ds = render_binding_dataset(
        BindingSettings.from_config(dict(image_size=32, n_queries=2, n_pairs=2))
    )
    assert set(ds.data_vars) == set(CONTRACT)
    for array, (dtype, dims) in CONTRACT.items():
        assert (str(ds[array].dtype), ds[array].dims) == (dtype, dims), array


def test_a_missing_block_or_meaning_is_an_error():
    with pytest.raises(ValueError, match="expected one each"):
        contracts.render("<!-- contract: binding.zarr -->\n<!-- end contract -->\n")
    with pytest.raises(ValueError, match="without a MEANING"):
        contracts.table({"a": ("uint8", ("x",))}, {})
