"""The restartable chunked driver (repdiag.encoders.jacobian.cache): a killed run resumes with the
missing chunks only, an unreadable chunk is recomputed, the cache key follows what determines
the spectra."""

from __future__ import annotations

import pytest
import torch
import xarray as xr

from repdiag.encoders.jacobian import cache
from repdiag.encoders.jacobian.cache import run_chunked
from repdiag.encoders.jacobian.store import spectra_dataset
from tests.encoders.jacobian.models import SmallCNN, engine, images, small_mlp
from tests.simulated_cuda import GiB, SimulatedMemory, simulated_cuda, simulated_memory

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


# ------------------------------------------------ pass sizes on a GPU (simulated CUDA, issue 59)

RANDOMIZED = {"method": "randomized", "k": 4, "power_iters": 1, "seed": 0}
REAL_ENGINE = cache.jacobian_spectra
OUT_OF_MEMORY = torch.OutOfMemoryError  # torch.cuda.OutOfMemoryError, kept from any patch


def _memory_hungry(real, calls: list, per_image: float, oom_above: int | None = None):
    """``jacobian_spectra`` whose pass takes ``per_image`` bytes per image it holds on the
    simulated GPU (the peak the memory stats then report), and runs out of memory above
    ``oom_above`` products a pass."""

    def engine_call(model, part, **kw):
        calls.append((len(part), kw["batch_size"]))
        if oom_above is not None and kw["batch_size"] > oom_above:
            raise OUT_OF_MEMORY("CUDA out of memory. Tried to allocate 2.00 GiB")
        memory = simulated_memory()
        memory.allocated = 4096  # the model's parameters, still there after the call
        out = real(model, part, **kw)
        held = min(max(1, kw["batch_size"] // kw["k"]), len(part))
        memory.peak = max(memory.peak, int(memory.allocated + per_image * held))
        return out

    return engine_call


def _sized_run(tmp_path, monkeypatch, folder: str, per_image: float, calls: list, kill=None):
    model, x = small_mlp(), images(30, (12,))
    hungry = _memory_hungry(REAL_ENGINE, calls, per_image)
    if kill is not None:

        def hungry(*args, _inner=hungry, **kw):  # killed after `kill` calls
            if len(calls) == kill:
                raise KeyboardInterrupt("killed")
            return _inner(*args, **kw)

    monkeypatch.setattr(cache, "jacobian_spectra", hungry)
    with simulated_cuda(SimulatedMemory(free=FREE, total=80 * GiB)) as cuda:
        return run_chunked(
            model, x, tmp_path / folder, chunk_size=1, device=cuda, **engine(**RANDOMIZED)
        )


FREE = 16 << 10  # 16 KiB free on the simulated card: the planner sizes a pass of 2 images


def test_on_a_gpu_the_first_call_measures_its_peak_and_sizes_the_rest(tmp_path, monkeypatch):
    """batch_size null on CUDA: the first call runs at the planner's size b0, measures its peak
    per image (max_memory_allocated above what stays allocated) and the rest hold as many
    images as 80% of the free memory takes at that rate; recorded; a killed run resumes with the
    same passes, bit for bit; the spectra are the CPU's."""
    from repdiag.encoders.jacobian.pass_size import memory_batch_size

    b0 = memory_batch_size(
        small_mlp(), images(2, (12,)), engine(**RANDOMIZED), torch.device("cpu"), free_bytes=FREE
    )
    per_image = 0.8 * FREE / 5.5  # 5 images a pass fit
    calls: list = []
    got = _sized_run(tmp_path, monkeypatch, "run", per_image, calls)
    first = b0 // 4
    assert b0 == 8 and calls[0] == (first, b0)
    assert calls[1:] == [(5, 20)] * ((30 - first) // 5) + (
        [((30 - first) % 5, 20)] if (30 - first) % 5 else []
    )
    record = got.pass_sizing
    assert record["source"] == "sized to free GPU memory" and record["planned"] == b0
    assert record["measured_peak_bytes_per_image"] == pytest.approx(per_image, rel=1e-3)
    assert record["measured_batch_size"] == 20 and got.batch_size == 20
    assert record["schedule"] == [[0, b0], [1, 20]] and record["out_of_memory"] == []
    monkeypatch.setattr(cache, "jacobian_spectra", REAL_ENGINE)
    cpu = run_chunked(
        small_mlp(), images(30, (12,)), tmp_path / "cpu", chunk_size=1, **engine(**RANDOMIZED)
    )
    for name in cpu:
        torch.testing.assert_close(got[name], cpu[name], rtol=1e-10, atol=1e-12)

    killed: list = []
    with pytest.raises(KeyboardInterrupt):
        _sized_run(tmp_path, monkeypatch, "killed", per_image, killed, kill=2)
    resumed: list = []
    again = _sized_run(tmp_path, monkeypatch, "killed", per_image, resumed)
    assert resumed == calls[2:]  # the passes of the uninterrupted run, none measured again
    assert again.pass_sizing["resumed"] and again.pass_sizing["schedule"] == [[0, b0], [1, 20]]
    for name in got:
        assert torch.equal(again[name], got[name])


def test_the_measured_sizing_check_sees_the_planner_only_sizing_put_back(tmp_path, monkeypatch):
    """The break put back (every pass at the planner's size, no measurement): the check above
    sees calls at b0 where it expects the measured 20 products."""
    monkeypatch.setattr(cache, "_measured_resize", lambda passes, *args: None)
    calls: list = []
    _sized_run(tmp_path, monkeypatch, "run", 0.8 * FREE / 5.5, calls)
    assert {size for _, size in calls} != {20} and all(size != 20 for _, size in calls)


def test_an_out_of_memory_pass_is_halved_and_retried_there_and_recorded(tmp_path, monkeypatch):
    """32 products a pass given, more than 8 run out of memory: the call is retried at 16, then
    8 from the same chunk on; every later call keeps 8; the store's attrs record both retries;
    the spectra equal a run given 8 bit for bit. A pass of one product that does not fit fails."""
    model, x = small_mlp(), images(12, (12,))
    settings = engine(**{**RANDOMIZED, "batch_size": 32})
    real, calls = cache.jacobian_spectra, []
    monkeypatch.setattr(cache, "jacobian_spectra", _memory_hungry(real, calls, 1.0, oom_above=8))
    with simulated_cuda() as cuda:
        got = run_chunked(model, x, tmp_path / "run", chunk_size=1, device=cuda, **settings)
        assert simulated_memory().emptied == 2
        model.cpu()
    assert calls == [(8, 32), (4, 16)] + [(2, 8)] * 6
    retries = [
        {"chunk": 0, "batch_size": 32, "retried_with": 16},
        {"chunk": 0, "batch_size": 16, "retried_with": 8},
    ]
    assert got.pass_sizing["out_of_memory"] == retries and got.batch_size == 8
    ds = spectra_dataset(got, [str(i) for i in range(12)], ["p"] * 12, k=4, formulas=["pr"])
    ds.to_zarr(tmp_path / "store.zarr")
    stored = xr.open_zarr(tmp_path / "store.zarr").attrs["pass_sizing"]
    assert stored["out_of_memory"] == retries and stored["schedule"] == [[0, 8]]
    monkeypatch.setattr(cache, "jacobian_spectra", real)
    with simulated_cuda() as cuda:
        at_8 = run_chunked(
            model, x, tmp_path / "at8", chunk_size=1, device=cuda, **{**settings, "batch_size": 8}
        )
        model.cpu()
    for name in at_8:
        assert torch.equal(got[name], at_8[name])

    calls.clear()
    monkeypatch.setattr(cache, "jacobian_spectra", _memory_hungry(real, calls, 1.0, oom_above=0))
    with simulated_cuda() as cuda, pytest.raises(torch.cuda.OutOfMemoryError):
        run_chunked(model, x, tmp_path / "never", chunk_size=1, device=cuda, **settings)
    assert [size for _, size in calls] == [32, 16, 8, 4, 2, 1]


def test_the_oom_check_sees_the_job_die_without_the_retry(tmp_path, monkeypatch):
    """The break put back (an out-of-memory error not caught): the job dies at its first call."""
    real, calls = cache.jacobian_spectra, []
    monkeypatch.setattr(cache, "jacobian_spectra", _memory_hungry(real, calls, 1.0, oom_above=8))
    monkeypatch.setattr(cache.torch.cuda, "OutOfMemoryError", type("Other", (Exception,), {}))
    settings = engine(**{**RANDOMIZED, "batch_size": 32})
    with simulated_cuda() as cuda, pytest.raises(torch.OutOfMemoryError):
        run_chunked(small_mlp(), images(12, (12,)), tmp_path, chunk_size=1, device=cuda, **settings)
    assert calls == [(8, 32)]
