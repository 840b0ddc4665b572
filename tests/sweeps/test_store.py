"""Sweep stores are xarray stores, and no sweep is ever killed for memory.

Oracles: the in-memory sweep (no store: another code path) for the stored and lazy
Datasets; enumeration of the flat grid for the chunk blocks; the byte count of the
outputs computed by hand for the memory estimate.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pysharp as ps
from pysharp.sweeps import _sweep
from pysharp.sweeps._store import block_shape, chunk_bounds

xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")
dask_array = pytest.importorskip("dask.array")

GRID = dict(lr=[0.1, 0.5, 2.0], wd=[1e-4, 1e-3], seeds=[0, 3], init_norm=[1.0, 8.0])
RUN = dict(steps=400, record_every=50, sharpness_every=100)
MODEL = {"name": "bn_linear_regression", "d": 12, "n": 8, "seed": 1}
DIMS = ("lr", "wd", "seed", "init_norm")


@pytest.fixture(scope="module")
def in_memory():
    return ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, progress=False)


def _without_call_attrs(ds):
    ds = ds.copy()
    for key in ("chunks_computed", "chunks_reused", "trajectories_computed"):
        ds.attrs.pop(key, None)
    return ds


def test_open_zarr_returns_the_sweep_dataset(tmp_path, in_memory):
    store = tmp_path / "s.zarr"
    ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no consolidated-metadata or unknown-node warnings
        opened = xr.open_zarr(store)
    xr.testing.assert_identical(opened.compute(), _without_call_attrs(in_memory))
    xr.testing.assert_identical(opened.compute(), ps.open_sweep(store).compute())
    # the named axes are in the Zarr metadata itself, for any Zarr reader
    group = zarr.open_group(str(store), mode="r")
    assert tuple(group["loss"].metadata.dimension_names) == DIMS + ("step",)
    assert tuple(group["sharpness"].metadata.dimension_names) == DIMS + ("sharpness_step",)
    assert tuple(group["final_loss"].metadata.dimension_names) == DIMS
    np.testing.assert_array_equal(group["lr"][...], GRID["lr"])
    # the completion markers and checksums stay next to the data
    markers = sorted((store / "_pysharp_done").glob("[0-9]*.json"))
    assert len(markers) == len(chunk_bounds((3, 2, 2, 2), 5)) == 6


def test_store_backed_sweep_is_lazy_and_equals_the_in_memory_one(tmp_path, in_memory):
    store = tmp_path / "s.zarr"
    got = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    assert all(isinstance(v.data, dask_array.Array) for v in got.data_vars.values())
    # one dask chunk per stored chunk: blocks of whole (seed, init_norm) rows
    assert got.loss.data.chunksize == (1, 1, 2, 2, got.sizes["step"])
    xr.testing.assert_identical(got.compute(), in_memory)
    again = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    assert again.attrs["chunks_reused"] == 6 and again.attrs["chunks_computed"] == 0
    xr.testing.assert_equal(again.compute(), in_memory)


def _per_trajectory_bytes(steps: int, record_every: int, sharpness_every: int) -> int:
    """Outputs of one BN linear regression trajectory, counted by hand."""
    records = steps // record_every + 1
    sharp = steps // sharpness_every + 1
    floats = (3 * records + 2 * sharp  # loss, norm2, eff_lr; sharpness, eos_ratio
              + 2 + 3 + 1)  # final_loss, final_eff_lr; final/min sharpness, drop; cosine
    return 8 * floats + 8 + 8 + 1  # eos_entry_step, diverged_step (int64); diverged (bool)


def _size_in_message(message: str) -> float:
    number, unit = re.search(r"need ([\d.e+]+) (\w+) in memory", message).groups()
    return float(number) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].index(unit)


def test_an_in_memory_sweep_that_cannot_fit_is_refused_at_once(tmp_path):
    """lr 2000 x wd 2000 x 10 seeds, 1e6 steps recorded at every step: ~873 TiB."""
    lr, wd = np.geomspace(1e-3, 0.9, 2000), np.linspace(0.0, 1e-3, 2000)
    steps = 10**6
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError, match="store=") as info:
            ps.sweep(MODEL, lr=lr, wd=wd, seeds=range(10), steps=steps, record_every=1,
                     progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20  # nothing of the result was allocated
    message = str(info.value)
    assert "40000000 trajectories" in message
    expected = 4e7 * _per_trajectory_bytes(steps, 1, steps // 20)
    assert _size_in_message(message) == pytest.approx(expected, rel=5e-3)  # 3 digits printed
    # with a store the results are fine, but one chunk of 2040 such trajectories is not
    with pytest.raises(MemoryError, match="chunk_size"):
        ps.sweep(MODEL, lr=lr, wd=wd, seeds=range(10), steps=steps, record_every=1,
                 progress=False, store=tmp_path / "big.zarr")
    assert not (tmp_path / "big.zarr").exists()


def test_check_memory_thresholds():
    """The refusal happens exactly where results + chunk work exceed the safety fraction."""
    out = {"loss": ((11,), "float64"), "diverged": ((), "bool")}
    shape, chunk_size = (4, 3, 2, 1), 5
    per = 11 * 8 + 1
    assert block_shape(shape, chunk_size) == (1, 2, 2, 1)  # 2 wd rows of 2 seeds: 4 <= 5
    total, work = 24 * per, _sweep._CHUNK_WORK * 4 * per
    need = (total + work) / _sweep._SAFETY
    assert _sweep.check_memory(out, shape, chunk_size, in_memory=True,
                               available=math.ceil(need)) == 1
    with pytest.raises(MemoryError, match="store="):
        _sweep.check_memory(out, shape, chunk_size, in_memory=True,
                            available=math.floor(need) - 1)
    # streamed to a store only the chunks count: ten of them may wait at once
    assert _sweep.check_memory(out, shape, chunk_size, in_memory=False,
                               available=math.ceil(10 * work / _sweep._SAFETY)) == 10
    with pytest.raises(MemoryError, match="lower chunk_size"):
        _sweep.check_memory(out, shape, chunk_size, in_memory=False,
                            available=math.floor(work / _sweep._SAFETY) - 1)


def test_a_grid_beyond_memory_runs_on_a_store(tmp_path, monkeypatch, in_memory):
    """With the memory made too small for the results, the store-backed sweep still runs."""
    per = sum(v.nbytes for v in in_memory.data_vars.values()) // 24
    chunk = _sweep._CHUNK_WORK * 4 * per  # blocks of 4 trajectories
    monkeypatch.setattr(_sweep, "available_memory", lambda: int(2.5 * chunk / _sweep._SAFETY))
    with pytest.raises(MemoryError, match="store="):
        ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, progress=False)
    submitted, written = [], lambda: len(list((tmp_path / "s.zarr" / "_pysharp_done")
                                              .glob("[0-9]*.json")))
    waiting = []

    class Counting(ThreadPoolExecutor):
        lock = threading.Lock()

        def submit(self, fn, *args, **kwargs):
            with self.lock:
                submitted.append(args[-2:])
                waiting.append(len(submitted) - written())
            return super().submit(fn, *args, **kwargs)

    with Counting(2) as pool:
        got = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=tmp_path / "s.zarr",
                       executor=pool, progress=False)
    assert max(waiting) <= 2  # 2.5 chunks of room: at most two results in flight
    assert sorted(submitted) == chunk_bounds((3, 2, 2, 2), 5)
    xr.testing.assert_identical(got.compute(), in_memory)


@pytest.mark.parametrize("shape", [(3, 2, 2, 2), (7, 5, 1, 3), (1, 1, 9, 1), (2, 3, 4, 5)])
@pytest.mark.parametrize("chunk_size", [1, 2, 5, 7, 12, 1000])
def test_chunks_are_contiguous_grid_blocks(shape, chunk_size):
    """Enumeration: every chunk is a box of the grid and a contiguous flat range."""
    bounds = chunk_bounds(shape, chunk_size)
    assert bounds[0][0] == 0 and bounds[-1][1] == math.prod(shape)
    assert all(a < b <= a + chunk_size for a, b in bounds)
    assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))  # tile, in order
    block = block_shape(shape, chunk_size)
    for a, b in bounds:
        index = np.array(np.unravel_index(np.arange(a, b), shape))
        lo, hi = index.min(axis=1), index.max(axis=1)
        box = list(itertools.product(*[range(x, y + 1) for x, y in zip(lo, hi)]))
        assert len(box) == b - a  # a box: the points are exactly the product of their ranges
        assert np.all(lo % np.array(block) == 0) and np.all(hi - lo < np.array(block))
    # as large as allowed: merging two neighbouring rows would exceed chunk_size
    j = next(i for i, n in enumerate(block) if n != 1 or i == len(shape) - 1)
    if block[j] < shape[j]:
        assert (block[j] + 1) * math.prod(shape[j + 1:]) > chunk_size


def test_a_store_larger_than_the_free_disk_is_refused_before_any_work(tmp_path, monkeypatch):
    """Oracle: the byte count of the outputs by hand (8-byte floats on the record axes)."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 0, 10**4))
    store = tmp_path / "big.zarr"
    with pytest.raises(ValueError, match=r"need about .* on disk .* only 9.77 KiB are free"):
        ps.sweep("toy3d", lr=[0.1, 0.2], wd=1e-3, steps=1000, record_every=1,
                 store=store, progress=False)
    assert not store.exists()  # refused before the store was made
    layout = {"loss": ((1001,), "float64"), "flag": ((), "bool")}
    assert _sweep.store_bytes(layout, (3, 2)) == 6 * (1001 * 8 + 1)
    _sweep.check_disk(layout, (3, 2), store, free=6 * (1001 * 8 + 1))  # exactly fits
    with pytest.raises(ValueError, match="46.9 KiB on disk"):
        _sweep.check_disk(layout, (3, 2), store, free=1000)


def test_record_every_beyond_steps_is_refused():
    with pytest.raises(ValueError, match=r"record_every = 200 is larger than steps = 100"):
        ps.sweep("toy3d", lr=0.1, wd=1e-3, steps=100, record_every=200, progress=False)


def test_a_store_mismatch_names_each_differing_entry_readably(tmp_path):
    store = tmp_path / "s.zarr"
    ps.sweep("toy3d", lr=np.geomspace(0.05, 1, 8), wd=1e-3, steps=100, sharpness_every=20,
             store=store, progress=False)
    with pytest.raises(ps.sweeps.StoreMismatch) as err:
        ps.sweep("toy3d", lr=np.geomspace(0.05, 1, 12), wd=1e-3, steps=200, sharpness_every=20,
                 store=store, progress=False)
    text = str(err.value)
    assert "grid.lr: stored 8 values from 0.05 to 1, requested 12 values from 0.05 to 1" in text
    assert "settings.steps: stored 100, requested 200" in text
    assert ", , " not in text


def test_trajectories_computed_counts_only_what_this_call_ran(tmp_path):
    store = tmp_path / "s.zarr"
    kw = dict(lr=[0.1, 0.2, 0.3], wd=[1e-3, 2e-3], steps=50, sharpness_every=10,
              chunk_size=2, store=store, progress=False)
    first = ps.sweep("toy3d", **kw)
    assert first.attrs["trajectories_computed"] == 6 and first.attrs["chunks_computed"] == 3
    (store / "_pysharp_done" / "0.json").unlink()
    again = ps.sweep("toy3d", **kw)
    assert again.attrs["chunks_computed"] == 1 and again.attrs["chunks_reused"] == 2
    assert again.attrs["trajectories_computed"] == 2


def test_an_interrupted_sweep_keeps_its_finished_chunks_and_says_so(tmp_path, monkeypatch):
    """Ctrl-C (a KeyboardInterrupt) in the third chunk: two chunks are kept and marked,
    SweepInterrupted says so, and the same call then computes only the rest."""

    store = tmp_path / "s.zarr"
    kw = dict(lr=[0.1, 0.2, 0.3], wd=[1e-3, 2e-3], steps=50, sharpness_every=10,
              chunk_size=2, store=store, progress=False)
    real, calls = _sweep.compute_chunk, []

    def third_is_interrupted(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(_sweep, "compute_chunk", third_is_interrupted)
    with pytest.raises(ps.sweeps.SweepInterrupted) as stop:
        ps.sweep("toy3d", **kw)
    assert isinstance(stop.value, KeyboardInterrupt)
    assert (stop.value.done, stop.value.n_chunks, stop.value.store) == (2, 3, store)
    assert "2 of 3 chunks saved to" in str(stop.value)
    assert sorted(p.name for p in (store / "_pysharp_done").glob("[0-9]*.json")) == [
        "0.json", "1.json"]
    monkeypatch.setattr(_sweep, "compute_chunk", real)
    again = ps.sweep("toy3d", **kw)
    assert again.attrs["chunks_reused"] == 2 and again.attrs["chunks_computed"] == 1
