"""The restartable chunked driver (repdiag.encoders.jacobian.cache): a killed run resumes with the
missing chunks only, an unreadable chunk is recomputed, the cache key follows what determines
the spectra."""

from __future__ import annotations

import pytest
import torch

from repdiag.encoders.jacobian import cache
from repdiag.encoders.jacobian.cache import run_chunked
from tests.encoders.jacobian.models import SmallCNN, engine, images, small_mlp

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------- restarts


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_killed_run_resumes_with_the_missing_chunks_only(tmp_path, monkeypatch):
    model, x = SmallCNN(), images(5, (3, 8, 8))
    kwargs = {"chunk_size": 2, "method": "auto", "k": 4, "power_iters": 1, "seed": 2}
    uninterrupted = run_chunked(model, x, tmp_path / "reference", **engine(**kwargs))

    real, calls = cache.jacobian_spectra, []

    def killed_after_two_chunks(*args, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        calls.append(len(args[1]))
        return real(*args, **kw)

    monkeypatch.setattr(cache, "jacobian_spectra", killed_after_two_chunks)
    with pytest.raises(KeyboardInterrupt):
        run_chunked(model, x, tmp_path / "run", **engine(**kwargs))
    assert _listing(tmp_path / "run") == ["chunk_0000.npz", "chunk_0001.npz"]  # no temporaries

    calls.clear()
    monkeypatch.setattr(
        cache, "jacobian_spectra", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw)
    )
    resumed = run_chunked(model, x, tmp_path / "run", **engine(**kwargs))
    assert calls == [1]  # only the last chunk (1 image) was computed
    assert (
        resumed.methods
        == uninterrupted.methods
        == {"stage0": "exact", "stage1": "exact", "final": "randomized"}
    )
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name])


def test_an_unreadable_cached_chunk_is_recomputed(tmp_path):
    model, x = small_mlp(), images(3, (12,))
    first = run_chunked(model, x, tmp_path, chunk_size=2, **engine(method="exact"))
    (tmp_path / "chunk_0001.npz").write_bytes(b"not a zip file")
    again = run_chunked(model, x, tmp_path, chunk_size=2, **engine(method="exact"))
    assert torch.equal(first["output"], again["output"])


def test_cache_key_changes_with_settings_weights_and_images():
    model, x = small_mlp(), images(2, (12,))
    weights, pixels = cache.model_fingerprint(model), cache.tensor_digest(x)
    key = cache.cache_key({"k": 4}, weights, pixels)
    assert key == cache.cache_key(
        {"k": 4}, cache.model_fingerprint(small_mlp()), cache.tensor_digest(x.clone())
    )
    assert key != cache.cache_key({"k": 5}, weights, pixels)
    assert key != cache.cache_key({"k": 4}, cache.model_fingerprint(small_mlp(seed=1)), pixels)
    assert key != cache.cache_key({"k": 4}, weights, cache.tensor_digest(x + 1e-9))
