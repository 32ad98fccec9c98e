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
    # k = 4 and 8 products per pass: 2 images per pass, so each engine call takes 2 chunks of 1
    kwargs = {"chunk_size": 1, "method": "auto", "k": 4, "power_iters": 1, "seed": 2}
    kwargs["batch_size"] = 8
    uninterrupted = run_chunked(model, x, tmp_path / "reference", **engine(**kwargs))
    assert uninterrupted.batch_size == 8

    real, calls = cache.jacobian_spectra, []

    def killed_after_two_calls(*args, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        calls.append(len(args[1]))
        return real(*args, **kw)

    monkeypatch.setattr(cache, "jacobian_spectra", killed_after_two_calls)
    with pytest.raises(KeyboardInterrupt):
        run_chunked(model, x, tmp_path / "run", **engine(**kwargs))
    assert calls == [2, 2]
    assert _listing(tmp_path / "run") == [f"chunk_000{i}.npz" for i in range(4)]  # no temporaries

    calls.clear()
    monkeypatch.setattr(
        cache, "jacobian_spectra", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw)
    )
    # resumed with another batch_size: the cached chunks' one is kept, so the passes are equal
    resumed = run_chunked(model, x, tmp_path / "run", **engine(**{**kwargs, "batch_size": 64}))
    assert calls == [1] and resumed.batch_size == 8  # only the last chunk (1 image) computed
    assert (
        resumed.methods
        == uninterrupted.methods
        == {"stage0": "exact", "stage1": "exact", "final": "randomized"}
    )
    for name in uninterrupted:
        assert torch.equal(resumed[name], uninterrupted[name])


def test_a_pass_is_not_capped_by_the_chunk_size(tmp_path, monkeypatch):
    """chunk_size is the restart granularity: 80 images in chunks of 8, k = 4 and batch_size
    1024 run in one engine call of 80 images, 320 products in one randomized pass (more than
    the 8 x 4 a chunk holds, and more than 256); the spectra equal a chunk-per-call run's."""
    model, x = small_mlp(), images(80, (12,))
    settings = engine(method="randomized", k=4, power_iters=1, seed=0)
    real, calls = cache.jacobian_spectra, []
    monkeypatch.setattr(
        cache, "jacobian_spectra", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw)
    )
    big = run_chunked(model, x, tmp_path / "big", chunk_size=8, **{**settings, "batch_size": 1024})
    assert calls == [80] and big.batch_size == 1024
    assert len(list((tmp_path / "big").glob("chunk_*.npz"))) == 10
    calls.clear()
    small = run_chunked(
        model, x, tmp_path / "small", chunk_size=8, **{**settings, "batch_size": 32}
    )
    assert calls == [8] * 10  # 32 // 4 = 8 images per pass: one chunk per call
    for name in small:
        torch.testing.assert_close(big[name], small[name], rtol=1e-10, atol=1e-12)


def test_chunks_per_call_follow_the_batch():
    assert cache.chunks_per_call(256, 32, 8) == 1  # the paper's 8 images x k = 32
    assert cache.chunks_per_call(4096, 32, 8) == 16  # 128 images per pass
    assert cache.chunks_per_call(16, 32, 8) == 1  # at least one chunk
    assert cache.chunks_per_call(1024, 4, 100) == 2


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
