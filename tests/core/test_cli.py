from __future__ import annotations

import numpy as np
import xarray as xr

from repdiag.core.cli import main
from repdiag.core.store import write_store


def test_inspect_prints_dimensions_coordinates_arrays_and_provenance(tmp_path, capsys):
    ds = xr.Dataset(
        {"emb_final": (("image", "dim_final"), np.arange(12, dtype=np.float32).reshape(3, 4))},
        coords={"image": np.array(["query/a", "query/b", "query/c"], dtype=object)},
    )
    path = write_store(tmp_path / "m.zarr", ds, config={"batch_size": 8}, seed=3)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "image: 3" in out and "dim_final: 4" in out
    assert "query/a, query/b, query/c" in out
    assert "emb_final" in out and "min 0  mean 5.5  max 11" in out
    assert '"batch_size": 8' in out and "seed: 3" in out


def test_inspect_of_a_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "gone.zarr")]) == 2
    assert "gone.zarr does not exist" in capsys.readouterr().err


def test_validate_reports_the_bad_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: {}\nmodels: {m: {source: zoo, id: x, family: nope}}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "family" in err and "nope" in err
