"""Sweep stores are xarray stores, and no sweep is ever killed for memory.

Oracles: the in-memory sweep (no store: another code path) for the stored and lazy
Datasets; enumeration of the flat grid for the chunk blocks; the byte count of the
outputs computed by hand for the memory estimate.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp.sweeps import _sweep
from pysharp.sweeps._compute import Settings
from pysharp.sweeps._store import SweepStore, block_shape, chunk_bounds, disk_estimate

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
    book = 8 * _sweep._PER_CHUNK  # 4 lr x 2 blocks of wd rows: 8 chunks' bookkeeping
    total, work = 24 * per + book, _sweep._CHUNK_WORK * 4 * per
    need = (total + work) / _sweep._SAFETY
    assert _sweep.check_memory(out, shape, chunk_size, in_memory=True,
                               available=math.ceil(need)) == 1
    with pytest.raises(MemoryError, match="store="):
        _sweep.check_memory(out, shape, chunk_size, in_memory=True,
                            available=math.floor(need) - 1)
    # streamed to a store only the chunks count: ten of them may wait at once
    assert _sweep.check_memory(out, shape, chunk_size, in_memory=False,
                               available=math.ceil((10 * work + book) / _sweep._SAFETY)) == 10
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
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 0, 10**4))
    store = tmp_path / "big.zarr"
    with pytest.raises(ValueError, match=r"need about .* on disk .* only 9.77 KiB are free"):
        ps.sweep("toy3d", lr=[0.1, 0.2], wd=1e-3, steps=1000, record_every=1,
                 store=store, progress=False)
    assert not store.exists()  # refused before the store was made


def _disk_used(path) -> int:
    """What ``du`` counts: the blocks of every file and folder under ``path``."""
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, dirs, files in os.walk(path) for name in dirs + files)


def _store_layout(ds) -> tuple[dict, tuple[int, ...], list[int]]:
    """(outputs, grid shape, coordinate lengths) of a sweep, from its recorded identity."""
    identity = json.loads(ds.attrs["pysharp_sweep"])
    outputs = {k: (tuple(tail), dtype) for k, (tail, dtype) in identity["outputs"].items()}
    return outputs, tuple(ds.sizes[d] for d in DIMS), [ds.sizes[c] for c in ds.coords]


def test_the_disk_estimate_counts_every_file_and_folder_a_chunk_writes(tmp_path, monkeypatch):
    """Oracle: the blocks a real store of one-trajectory chunks takes, measured (``du``).

    Each chunk writes a file per output and a marker under nested folders, each in whole
    blocks: 60 chunks of a toy run take megabytes where their numbers take kilobytes. The
    estimate must be an upper bound close to it, so a 2e6-chunk sweep is estimated at its
    true ~hundred gigabytes (the issue measured 174 GB), not the 582 MB of its numbers.
    """
    store = tmp_path / "s.zarr"
    kw = dict(lr=np.geomspace(0.05, 1, 60), wd=1e-3, steps=40, record_every=10,
              sharpness_every=20, chunk_size=1, progress=False)
    ds = ps.sweep("toy3d", store=store, **kw)
    used = _disk_used(store) + os.lstat(store).st_blocks * 512
    # just too little room for the same store: refused up front, naming chunks and files
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * used, 0, used * 9 // 10))
    with pytest.raises(ValueError, match=r"60 chunks: \d+ files and folders .* raise chunk_size"):
        ps.sweep("toy3d", store=tmp_path / "next.zarr", **kw)
    assert not (tmp_path / "next.zarr").exists()
    outputs, shape, coords = _store_layout(ds)
    block = os.statvfs(tmp_path).f_frsize
    estimate, files, n_chunks = disk_estimate(outputs, shape, 1, block, coords)
    numbers = sum(v.nbytes for v in ds.data_vars.values())
    assert n_chunks == 60 and used > 20 * numbers  # the overhead is the store's size
    assert used <= estimate <= 1.35 * used
    assert sum(1 for _ in store.rglob("*")) <= files
    _sweep.check_disk(outputs, shape, tmp_path / "next.zarr", chunk_size=1, coord_sizes=coords,
                      free=estimate, block=block)
    with pytest.raises(ValueError, match=r"only 100 more can be made .* \(free inodes\)"):
        _sweep.check_disk(outputs, shape, tmp_path / "next.zarr", chunk_size=1,
                          coord_sizes=coords, free=estimate, block=block, inodes=100)
    # resumed with all but 6 chunks done, a tenth of it is still to write
    for marker in list((store / "_pysharp_done").glob("[0-9]*.json"))[:6]:
        marker.unlink()
    _sweep.check_disk(outputs, shape, store, chunk_size=1, coord_sizes=coords,
                      free=estimate // 10 + 1, block=block)
    # the same run on 2e6 learning rates: per chunk what the 60 took, within the bound
    big = (2_000_000,) + shape[1:]
    estimate2, _, _ = disk_estimate(outputs, big, 1, block, [2_000_000] + coords[1:])
    assert 2e6 / 60 * used <= estimate2 <= 1.4 * 2e6 / 60 * used
    assert estimate2 > 100 * numbers / 60 * 2e6  # its numbers: what was estimated before


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


# -- a full disk --------------------------------------------------------------------------

def _third_write_fills_the_disk(monkeypatch):
    """SweepStore.write raises ENOSPC at its third call, as a full disk does midway."""
    real, calls = SweepStore.write, []

    def write(self, k, result):
        calls.append(k)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, k, result)

    monkeypatch.setattr(SweepStore, "write", write)
    return real


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_says_what_was_saved_and_the_same_call_resumes(tmp_path, monkeypatch,
                                                                   workers):
    """ENOSPC while the third chunk is written, in this process or from an executor's
    results: SweepDiskFull (an OSError) says two chunks were saved and how to resume, as
    Ctrl-C does; the same call then computes only the rest, equal to an uninterrupted run."""
    store = tmp_path / "s.zarr"
    kw = dict(lr=[0.1, 0.2, 0.3, 0.4], wd=[1e-3, 2e-3], steps=50, sharpness_every=10,
              chunk_size=2, store=store, progress=False)
    real = _third_write_fills_the_disk(monkeypatch)
    with ThreadPoolExecutor(workers) if workers else contextlib.nullcontext() as pool:
        with pytest.raises(ps.sweeps.SweepDiskFull) as full:
            ps.sweep("toy3d", executor=pool, **kw)
    assert isinstance(full.value, OSError) and full.value.errno == errno.ENOSPC
    assert (full.value.done, full.value.n_chunks, full.value.store) == (2, 4, store)
    assert isinstance(full.value.__cause__, OSError)
    assert "is full: 2 of 4 chunks saved to" in str(full.value)
    assert "free some space, then the same call" in str(full.value)
    assert len(list((store / "_pysharp_done").glob("[0-9]*.json"))) == 2
    assert not list((store / "_pysharp_done").glob("*.tmp*"))
    monkeypatch.setattr(SweepStore, "write", real)
    again = ps.sweep("toy3d", **kw)
    assert again.attrs["chunks_reused"] == 2 and again.attrs["chunks_computed"] == 2
    kw.pop("store")
    xr.testing.assert_equal(again.compute(), ps.sweep("toy3d", **kw))


def test_the_cli_on_a_full_disk_prints_what_was_saved_not_a_traceback(tmp_path, monkeypatch,
                                                                      capsys):
    from pysharp.cli import main

    (tmp_path / "t.toml").write_text(textwrap.dedent("""
        [model]
        name = "toy3d"
        [grid]
        lr = [0.1, 0.2, 0.3, 0.4]
        wd = [1e-3, 2e-3]
        [run]
        steps = 50
        sharpness_every = 10
        chunk_size = 2
    """))
    monkeypatch.chdir(tmp_path)
    _third_write_fills_the_disk(monkeypatch)
    assert main(["sweep", "t.toml", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "the disk holding t.zarr is full: 2 of 4 chunks saved there" in err
    assert "run `pysharp sweep t.toml --no-progress --resume`" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


_FILLS_A_TMPFS = """
import subprocess, sys
import numpy as np
import pysharp as ps
from pysharp.sweeps import _sweep

mount = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", mount], check=True)
_sweep.check_disk = lambda *args, **kwargs: None  # else refused up front, rightly
kw = dict(lr=np.geomspace(0.05, 1, 12), wd=[1e-3], steps=50, sharpness_every=10,
          chunk_size=1, progress=False)
try:
    ps.sweep("toy3d", store=mount + "/s.zarr", **kw)
except ps.sweeps.SweepDiskFull as full:
    print("full", full.done, full.n_chunks)
subprocess.run(["mount", "-o", "remount,size=64m", mount], check=True)
ds = ps.sweep("toy3d", store=mount + "/s.zarr", **kw)
print("resumed", ds.attrs["chunks_reused"], ds.attrs["chunks_computed"])
same = ps.sweep("toy3d", **kw)
print("equal", all(np.array_equal(ds[v].values, same[v].values, equal_nan=True)
                   for v in same.data_vars))
"""


def test_a_real_full_disk_mid_run_then_resumed(tmp_path):
    """A 300 kB tmpfs (in a user and mount namespace of its own, where the system allows
    one) fills while chunks are written: Zarr's ENOSPC becomes SweepDiskFull, and with the
    space grown the same call finishes bit-equal to a run in memory."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user and mount namespaces here (unshare -rm)")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "run.py").write_text(_FILLS_A_TMPFS)
    done = subprocess.run(["unshare", "-rm", sys.executable, "run.py", str(tmp_path / "mnt")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    full = next(line.split() for line in lines if line.startswith("full"))
    assert 0 < int(full[1]) < int(full[2]) == 12
    assert f"resumed {full[1]} {12 - int(full[1])}" in lines
    assert "equal True" in lines


# -- memory -------------------------------------------------------------------------------

def test_chunk_bounds_are_computed_on_demand_not_held(tmp_path):
    """2e5 chunks: no list of 2e5 tuples (37 MB; 1.85 GB at 1e7 chunks), in chunk_bounds or
    in a store over that grid; the values are those of the enumeration."""
    shape = (50_000, 1, 4, 1)
    tracemalloc.start()
    try:
        bounds = chunk_bounds(shape, 1)
        assert len(bounds) == 200_000
        assert bounds[123_457] == (123_457, 123_458) and bounds[-1] == (199_999, 200_000)
        settings = Settings(steps=10, record_every=10, sharpness_every=0, jitter=0.0,
                            eos_tol=0.05, backend="cpp")
        grid = {"lr": np.linspace(0.01, 0.5, 50_000), "wd": [1e-3], "seed": np.arange(4),
                "init_norm": [1.0]}
        out = {"final_loss": ((), "float64")}
        SweepStore(tmp_path / "s.zarr", {"test": 1}, _sweep.variables(out, None, settings),
                   _sweep.coordinates(grid, settings), DIMS, 1, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20
    assert bounds.trajectories(np.array([0, 5, 199_999])) == 3
    small = chunk_bounds((3, 2, 2, 2), 5)
    assert list(small) == [(0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 24)]


def test_check_memory_counts_the_per_chunk_bookkeeping():
    """1e7 chunks of one tiny trajectory each: their bookkeeping (_PER_CHUNK bytes a chunk,
    90 MB) is refused with 100 MB available (50 MB usable), and fits with 400 MB."""
    out = {"final_loss": ((), "float64")}
    shape = (10**7, 1, 1, 1)
    with pytest.raises(MemoryError, match=r"10000000 chunks need 85.8 MiB of bookkeeping"):
        _sweep.check_memory(out, shape, 1, in_memory=False, available=100 * 10**6)
    assert _sweep.check_memory(out, shape, 1, in_memory=False, available=400 * 10**6) > 1


def _fake_cgroups(tmp_path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A /proc/self/cgroup naming ``own`` and a /sys/fs/cgroup tree holding ``files``."""
    proc = tmp_path / "cgroup"
    proc.write_text(own)
    root = tmp_path / "sys"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


@pytest.mark.parametrize("own, files, room", [
    # cgroup v2: the process's own cgroup, 1 GB of which 400 MB used
    ("0::/user.slice/job-1.scope\n",
     {"user.slice/job-1.scope/memory.max": "1000000000\n",
      "user.slice/job-1.scope/memory.current": "400000000\n",
      "memory.max": "max\n", "memory.current": "9000000000\n"}, 600_000_000),
    # v2, the limit on an ancestor (the slice) binds
    ("0::/user.slice/job-1.scope\n",
     {"user.slice/memory.max": "2000000000\n", "user.slice/memory.current": "1900000000\n",
      "user.slice/job-1.scope/memory.max": "max\n",
      "user.slice/job-1.scope/memory.current": "300000000\n"}, 100_000_000),
    # cgroup v1: the memory controller's line, under <root>/memory
    ("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
     {"memory/docker/abc/memory.limit_in_bytes": "500000000\n",
      "memory/docker/abc/memory.usage_in_bytes": "200000000\n",
      "memory/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/memory.usage_in_bytes": "5000000000\n"}, 300_000_000),
])
def test_available_memory_reads_the_process_own_cgroup(tmp_path, own, files, room):
    """Oracle: the limit less the usage written into a fake cgroup tree; the root's files
    alone (what was read before) hold no limit in any of these."""
    proc, root = _fake_cgroups(tmp_path, own, files)
    assert _sweep.cgroup_room(proc, root) == room
    assert _sweep.available_memory(proc, root) == room  # far below this machine's memory
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "cgroup").write_text("0::/\n")  # the same tree read from its root only
    assert _sweep.cgroup_room(bare / "cgroup", root) is None


# -- the model's source -------------------------------------------------------------------

COSINE = """\
#include <pysharp/model.hpp>
template <class Real>
struct Cosine {   // L = k (1 - w_0 / ||w||) with k = c / n: scale-invariant
  Real c;
  PYSHARP_HD int dim() const { return 3; }
  PYSHARP_HD int work_size() const { return 0; }
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S*) const {
    const Real k = c / Real(3);
    const S r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
    const S inv = Real(1) / sqrt_(r2);
    *loss = k * (Real(1) - w[0] * inv);
    for (int j = 0; j < 3; ++j) g[j] = k * w[0] * w[j] * inv * inv * inv;
    g[0] = g[0] - k * inv;
    return value_of(r2) > Real(0);
  }
};
PYSHARP_MODEL(Cosine, PYSHARP_SCALAR(c))
"""
EDITED = ("k = c / Real(3)", "k = Real(2) * c / Real(3)")  # the k = c / n -> 2 c / n
SOURCE_RUN = dict(wd=[1e-3], steps=100, sharpness_every=20, chunk_size=1, progress=False)


@pytest.fixture(scope="module")
def cosine(tmp_path_factory):
    """A header compiled by load_model once for these tests, and the model."""
    if ps.build_info().get("available") is not True:
        pytest.skip("needs the compiled core")
    header = tmp_path_factory.mktemp("source") / "cosine.hpp"
    header.write_text(COSINE)
    return header, ps.load_model(header, c=1.5)


@contextlib.contextmanager
def _edited(header: Path):
    """The header with k doubled (as a user edits it), restored afterwards."""
    text = header.read_text()
    header.write_text(text.replace(*EDITED))
    try:
        yield
    finally:
        header.write_text(text)


def test_a_store_refuses_a_model_whose_header_changed(cosine, tmp_path):
    """Killed after two of four chunks, the header edited, the sweep called again: refused
    (the points would come from two models), naming the module; the store is untouched, and
    the model it was made with still resumes it, equal to a run in memory."""
    header, model = cosine
    store = tmp_path / "s.zarr"
    lr = [0.1, 0.2, 0.3, 0.4]
    first = ps.sweep(model, lr=lr, store=store, **SOURCE_RUN)
    for k in (2, 3):  # killed after two chunks
        (store / "_pysharp_done" / f"{k}.json").unlink()
    with _edited(header):
        edited = ps.load_model(header, c=1.5)
        w = np.array([0.3, -1.0, 2.0])
        assert edited.loss(w) == pytest.approx(2 * model.loss(w), rel=1e-15)
        for again in (edited, {"name": "loaded", "header": str(header), "fields": {"c": 1.5}}):
            with pytest.raises(ps.sweeps.StoreMismatch) as err:
                ps.sweep(again, lr=lr, store=store, **SOURCE_RUN)
            assert "model.modules.float64: stored" in str(err.value)
            assert "the model's compiled module differs" in str(err.value)
        assert len(list((store / "_pysharp_done").glob("[0-9]*.json"))) == 2
        resumed = ps.sweep(model, lr=lr, store=store, **SOURCE_RUN)
    assert resumed.attrs["chunks_reused"] == 2 and resumed.attrs["chunks_computed"] == 2
    xr.testing.assert_equal(resumed.compute(), ps.sweep(model, lr=lr, **SOURCE_RUN))
    recorded = json.loads(first.attrs["pysharp_sweep"])["model"]["modules"]
    assert recorded == {"float64": model.compiled_modules()["float64"]["module"]}


def test_workers_run_the_module_the_sweep_started_with(cosine):
    """The header edited while a sweep runs: a fresh worker process loads the module the
    sweep started with from its file, not the header as it is now."""
    header, model = cosine
    lr = [0.1, 0.3]
    here = ps.sweep(model, lr=lr, **SOURCE_RUN)
    with _edited(header):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            there = ps.sweep(model, lr=lr, executor=pool, **SOURCE_RUN)
        xr.testing.assert_equal(there, here)
        # where that file is absent (another machine's cache), the header must compile to it
        spec = ps.sweeps._spec.normalise(model)
        spec["modules"]["float64"]["file"] = str(header.parent / "elsewhere.so")
        with pytest.raises(ps.models.ModelCompileError, match="has changed since"):
            ps.sweeps._spec.build(spec)


def test_open_sweep_refuses_a_chunk_computed_by_another_module(cosine, tmp_path):
    """Each chunk's marker names the module that computed it: a chunk from another one is
    not the sweep's (refused by open_sweep, recomputed by the sweep)."""
    _, model = cosine
    store = tmp_path / "s.zarr"
    ps.sweep(model, lr=[0.1, 0.2], store=store, **SOURCE_RUN)
    ps.open_sweep(store)
    marker = store / "_pysharp_done" / "1.json"
    record = json.loads(marker.read_text())
    record["source"] = json.dumps({"float64": "_pysharp_model_0123456789abcdef01234567"})
    marker.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"computed by another model source \(first: \[1\]\)"):
        ps.open_sweep(store)
    again = ps.sweep(model, lr=[0.1, 0.2], store=store, **SOURCE_RUN)
    assert again.attrs["chunks_reused"] == 1 and again.attrs["chunks_computed"] == 1
    ps.open_sweep(store)
    assert json.loads(json.loads(marker.read_text())["source"]) == {
        "float64": model.compiled_modules()["float64"]["module"]}
