"""Sweeps: the grid's numbers equal raw engine calls; the store survives kills and corruption.

Bad arguments are refused before a store is created, and the default settings and summaries
are recorded as documented.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps

xr = pytest.importorskip("xarray")

GRID = dict(lr=[0.1, 0.5, 2.0], wd=[1e-4, 1e-3], seeds=[0, 3], init_norm=[1.0, 8.0])
RUN = dict(steps=600, record_every=50, sharpness_every=100)
MODEL = {"name": "bn_linear_regression", "d": 12, "n": 8, "seed": 1}


def _same(a, b) -> None:
    """Bit-for-bit equality of two sweep Datasets (NaN equal to NaN)."""
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name
    for name in a.coords:
        assert np.array_equal(a[name].values, b[name].values), name


@pytest.fixture(scope="module")
def reference():
    return ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, progress=False)


def _grid_batch(model, points):
    """w0 (B, D), lr (B,), wd (B,) of (lr, wd, seed, init_norm) tuples, built by hand."""
    directions = np.stack([model.random_point(seed=seed) for _, _, seed, _ in points])
    norms = np.array([p[3] for p in points])
    W0 = directions * (norms / np.linalg.norm(directions, axis=1))[:, None]  # as documented
    return W0, np.array([p[0] for p in points]), np.array([p[1] for p in points])


def test_chunks_equal_raw_engine_calls_bit_for_bit(reference):
    """Each chunk is the engine call one would write by hand: the same code path, same bits.

    Lone runs would not do: a lone trajectory and one inside a chunk sit in different
    SIMD lane groups, and after EoS entry the period-two dynamics amplify that rounding
    to ~1e-2 (on AVX-512 machines; see the next test for what a lone run must match).
    """
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    wt = ps.theory.min_norm_interpolant(model)
    points = list(itertools.product(GRID["lr"], GRID["wd"], GRID["seeds"], GRID["init_norm"]))
    # chunk_size=5 on the 3 x 2 x 2 x 2 grid: blocks of whole (seed, init_norm) rows, 2 x 2 = 4
    for start in range(0, len(points), 4):  # C order over the grid
        chunk = points[start:start + 4]
        W0, lr, wd = _grid_batch(model, chunk)
        tr = ps.run_gd_wd(model, W0, lr, wd, **RUN, first_trajectory=start)
        for j, (l, w, seed, norm) in enumerate(chunk):
            p = reference.sel(lr=l, wd=w, seed=seed, init_norm=norm)
            for name in ("loss", "norm2", "eff_lr", "sharpness", "eos_ratio"):
                assert p[name].values.tobytes() == getattr(tr, name)[:, j].tobytes(), name
            assert int(p.eos_entry_step) == tr.eos_entry_step[j]
            assert float(p.final_loss) == tr.loss[-1, j]
            assert float(p.min_sharpness) == np.nanmin(tr.sharpness[:, j])
            assert float(p.final_eff_lr) == tr.eff_lr[-1, j]
            assert float(p.final_eff_lr) == pytest.approx(l / ((1 - l * w) * tr.norm2[-1, j]),
                                                          rel=1e-14)
            cos = tr.w[j] @ wt / np.linalg.norm(tr.w[j]) / np.linalg.norm(wt)
            assert float(p.cosine_min_norm) == pytest.approx(cos, rel=1e-14)
    assert reference.loss.dims == ("lr", "wd", "seed", "init_norm", "step")
    assert reference.sharpness.dims[-1] == "sharpness_step"
    assert not reference.diverged.values.any()
    entered = reference.eos_entry_step.values
    assert (entered >= 0).any() and (entered < 0).any()  # both kinds of grid point


def test_lone_runs_equal_the_grid_before_eos_entry(reference):
    """A lone run is another code path (SIMD lanes): equal to rounding up to EoS entry."""
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    steps = RUN["steps"]
    for point in itertools.product(GRID["lr"], GRID["wd"], GRID["seeds"], GRID["init_norm"]):
        W0, lr, wd = _grid_batch(model, [point])
        tr = ps.run_gd_wd(model, W0[0], lr[0], wd[0], **RUN)
        p = reference.sel(lr=point[0], wd=point[1], seed=point[2], init_norm=point[3])
        entry = int(tr.eos_entry_step)
        assert int(p.eos_entry_step) == entry
        before = steps + 1 if entry < 0 else entry  # the entry record still agrees
        rec = tr.steps <= before
        # in L = 2 var(y) (1 - cos) near 0 rounding is absolute, not relative
        np.testing.assert_allclose(p.loss.values[rec], tr.loss[rec], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(p.norm2.values[rec], tr.norm2[rec], rtol=1e-12)
        sh = tr.sharpness_steps <= before
        np.testing.assert_allclose(p.sharpness.values[sh], tr.sharpness[sh], rtol=1e-9)


def test_chunking_and_executor_do_not_change_a_bit(reference):
    _same(reference, ps.sweep(MODEL, **GRID, **RUN, chunk_size=1000, progress=False))
    # forkserver: a fork of a process that has loaded JAX (the framework tests) may deadlock
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
        _same(reference, ps.sweep(MODEL, **GRID, **RUN, chunk_size=7, executor=pool,
                                  progress=False))


def test_dask_local_cluster_equals_in_process(reference):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        got = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, executor=client.get_executor(),
                       progress=False)
    _same(reference, got)


def test_store_resumes_and_reads_back(tmp_path, reference):
    pytest.importorskip("zarr")
    store = tmp_path / "s.zarr"
    first = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    _same(reference, first)
    assert first.attrs["chunks_computed"] == 6 and first.attrs["chunks_reused"] == 0
    again = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    assert again.attrs["chunks_computed"] == 0 and again.attrs["chunks_reused"] == 6
    _same(reference, again)
    _same(reference, ps.open_sweep(store))
    meta = json.loads(first.attrs["pysharp_sweep"])
    assert meta["grid"]["lr"] == GRID["lr"] and meta["model"] == MODEL
    assert meta["pysharp_version"] == ps.__version__ and meta["settings"]["backend"] == "cpp"


def _chunk_files(store: Path, name: str) -> list[Path]:
    root = store / name / "c"
    return sorted(root.rglob("*"), key=lambda p: [int(x) for x in p.relative_to(root).parts])


def test_corrupted_chunks_are_detected_and_recomputed(tmp_path, reference):
    pytest.importorskip("zarr")
    store = tmp_path / "s.zarr"
    ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    files = [f for f in _chunk_files(store, "loss") if f.is_file()]
    truncated = files[0]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    flipped = [f for f in _chunk_files(store, "final_sharpness") if f.is_file()][2]
    raw = bytearray(flipped.read_bytes())
    raw[-1] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    [f for f in _chunk_files(store, "final_loss") if f.is_file()][4].unlink()
    with pytest.raises(ValueError, match="3 of 6 chunks"):
        ps.open_sweep(store)  # never silently read
    got = ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    assert got.attrs["chunks_computed"] == 3 and got.attrs["chunks_reused"] == 3
    _same(reference, got)
    _same(reference, ps.open_sweep(store))


def test_a_different_sweep_is_refused_and_the_store_left_alone(tmp_path):
    pytest.importorskip("zarr")
    store = tmp_path / "s.zarr"
    ps.sweep(MODEL, **GRID, **RUN, chunk_size=5, store=store, progress=False)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with pytest.raises(ps.sweeps.StoreMismatch, match="grid"):
        ps.sweep(MODEL, **{**GRID, "lr": [0.1, 0.5, 3.0]}, **RUN, chunk_size=5, store=store,
                 progress=False)
    with pytest.raises(ps.sweeps.StoreMismatch, match="settings"):
        ps.sweep(MODEL, **GRID, **{**RUN, "steps": 700}, chunk_size=5, store=store,
                 progress=False)
    assert before == {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ps.sweeps.StoreMismatch, match="not a"):
        ps.sweep(MODEL, **GRID, **RUN, store=tmp_path / "other", progress=False)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


_KILLED_SWEEP = """
import pysharp as ps
ps.sweep({"name": "bn_matrix_completion", "size": 12, "rank": 12}, lr=[0.1, 0.2, 0.4, 0.8],
         wd=[1e-3, 2e-3], seeds=[0, 1], steps=2000, sharpness_every=20, chunk_size=1,
         store=STORE, progress=False)
"""


def test_sigkill_then_rerun_completes_without_recomputing(tmp_path):
    pytest.importorskip("zarr")
    store = tmp_path / "killed.zarr"
    script = tmp_path / "run.py"
    script.write_text(_KILLED_SWEEP.replace("STORE", repr(str(store))))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    done = store / "_pysharp_done"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if done.is_dir() and len(list(done.glob("[0-9]*.json"))) >= 3:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = len(list(done.glob("[0-9]*.json")))  # zarr.json: the group's metadata
    assert 3 <= kept < 16
    kwargs = dict(lr=[0.1, 0.2, 0.4, 0.8], wd=[1e-3, 2e-3], seeds=[0, 1], steps=2000,
                  sharpness_every=20, chunk_size=1, progress=False)
    spec = {"name": "bn_matrix_completion", "size": 12, "rank": 12}
    resumed = ps.sweep(spec, store=store, **kwargs)
    assert resumed.attrs["chunks_reused"] == kept
    assert resumed.attrs["chunks_computed"] == 16 - kept
    _same(ps.sweep(spec, **kwargs), resumed)
    assert {"test_loss", "sv_gap"} <= set(resumed.data_vars)


def test_diverging_points_are_flagged_and_the_sweep_completes():
    ds = ps.sweep(MODEL, lr=[0.1, 1e308], wd=0.0, steps=50, record_every=5, sharpness_every=10,
                  progress=False)
    div = ds.diverged.values.ravel()
    assert div.tolist() == [False, True]
    assert ds.diverged_step.values.ravel()[1] >= 1
    final_loss = ds.final_loss.values.ravel()
    assert np.isnan(final_loss[1]) and np.isfinite(final_loss[0])
    assert np.isnan(ds.cosine_min_norm.values.ravel()[1])


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="no_such_model"), "unknown model 'no_such_model'"),
    (dict(model={"name": "bn_linear_regression", "depth": 3}), "model.depth"),
    (dict(lr=[-0.1, 0.2]), "lr must be > 0"),
    (dict(wd=[]), "wd is empty"),
    (dict(seeds=[0.5]), "seeds must hold whole numbers"),
    (dict(lr=[0.1, 0.1]), "lr has repeated values"),
    (dict(lr=[2.0], wd=[0.6]), "lr \\* wd must be < 1"),
    (dict(steps=-1), "steps"),
])
def test_bad_arguments_fail_before_any_work(tmp_path, kwargs, message):
    args = dict(model=MODEL, **GRID, **RUN, store=tmp_path / "s.zarr", progress=False)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        ps.sweep(args.pop("model"), **args)
    assert not (tmp_path / "s.zarr").exists()


def test_model_instance_and_matrix_completion_summaries():
    model = ps.BNMatrixCompletion.synthetic(size=8, true_rank=2, rank=8, seed=2)
    ds = ps.sweep(model, lr=[0.1, 0.3], wd=1e-3, steps=300, sharpness_every=100, progress=False)
    meta = json.loads(ds.attrs["pysharp_sweep"])
    assert "array_sha256" in json.dumps(meta["model"])
    w0 = model.random_point(seed=0)
    tr = ps.run_gd_wd(model, w0, np.array([0.1, 0.3]), 1e-3, 300, record_every=3,
                      sharpness_every=100)
    np.testing.assert_allclose(ds.test_loss.values.ravel(), model.test_loss(tr.w), rtol=1e-12)
    U, V = model.factors(tr.w)
    sv = np.linalg.svd(U @ np.swapaxes(V, -1, -2), compute_uv=False)
    np.testing.assert_allclose(ds.sv_gap.values.ravel(), sv[:, 2] / sv[:, 1], rtol=1e-10)


def test_progress_bar_stays_off_without_a_terminal(capsys):
    ps.sweep(MODEL, lr=0.1, wd=1e-3, steps=20, progress=True)
    assert capsys.readouterr().err == ""


# -- configs and the command line ------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_configs_are_valid():
    from pysharp.sweeps._config import load_config

    configs = sorted(EXAMPLES.glob("*.toml"))
    if not configs:
        pytest.skip("examples/ not next to the tests")
    for path in configs:
        kwargs = load_config(path)
        assert kwargs["steps"] >= 1 and kwargs["lr"].size >= 1, path


@pytest.mark.parametrize("text, message", [
    ("[model]\nname='x'\n[grid]\nlr=0.1\nwd=0.0\n[run]\nsteps=10", "unknown model 'x'"),
    ("[model]\nname='toy3d'\n[grid]\nlr=0.1\nwd=0.0\nmomentum=0.9\n[run]\nsteps=10",
     "grid.momentum"),
    ("[model]\nname='toy3d'\n[grid]\nlr=0.1\nwd=0.0\n[run]\nsteps=10\nstep=3", "run.step"),
    ("[model]\nname='toy3d'\n[grid]\nlr=[]\nwd=0.0\n[run]\nsteps=10", "lr is empty"),
    ("[model]\nname='toy3d'\n[grid]\nlr=-1.0\nwd=0.0\n[run]\nsteps=10", "lr must be > 0"),
    ("[model]\nname='toy3d'\n[grid]\nwd=0.0\n[run]\nsteps=10", "missing grid.lr"),
    ("[model]\nname='toy3d'\n[grid]\nlr={geomspace=[0.1, 1]}\nwd=0.0\n[run]\nsteps=10",
     "grid.lr.geomspace"),
    ("[model]\nname='toy3d'\n[grid]\nlr=0.1\nwd=0.0\n[run]\nsteps=10\n[plots]\nx=1",
     "unknown section \\[plots\\]"),
])
def test_bad_configs_name_the_key(tmp_path, text, message):
    from pysharp.cli import main

    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=message):
        from pysharp.sweeps._config import load_config
        ps.sweep(**load_config(cfg), progress=False)
    assert main(["sweep", str(cfg), "--store", str(tmp_path / "s.zarr")]) == 2
    assert not (tmp_path / "s.zarr").exists()


def test_cli_sweep_resume_and_plot(tmp_path, capsys, monkeypatch):
    pytest.importorskip("zarr")
    pytest.importorskip("matplotlib")
    from pysharp.cli import main

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(textwrap.dedent("""
        [model]
        name = "bn_linear_regression"
        d = 12
        n = 8
        [grid]
        lr = { geomspace = [0.1, 2.0, 4] }
        wd = [1e-4, 1e-3]
        seeds = { range = 2 }
        [run]
        steps = 400
        sharpness_every = 100
        chunk_size = 5
        [output]
        store = "tiny.zarr"
    """))
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(cfg), "--no-progress"]) == 0
    assert "16 trajectories" in capsys.readouterr().out
    assert main(["sweep", str(cfg)]) == 2  # exists: needs --resume
    assert "--resume" in capsys.readouterr().err
    assert main(["sweep", str(cfg), "--resume", "--workers", "2"]) == 0
    assert "all 4 chunks reused from the store; nothing computed" in capsys.readouterr().out
    assert main(["plot", "tiny.zarr", "--x", "lr", "--y", "wd", "--metric",
                 "eos_entry_step,final_sharpness", "--out", "map.png"]) == 0
    assert main(["plot", "tiny.zarr", "--x", "sharpness_step", "--hue", "lr", "--metric",
                 "sharpness", "--sel", "wd=1e-3", "--out", "lines.png"]) == 0
    assert (tmp_path / "map.png").stat().st_size > 10_000
    assert (tmp_path / "lines.png").stat().st_size > 10_000
    assert main(["plot", "tiny.zarr", "--metric", "nonsense"]) == 2
    assert "unknown metric 'nonsense'" in capsys.readouterr().err


def test_cli_run_prints_a_table(tmp_path, capsys):
    from pysharp.cli import main

    assert main(["run", "toy3d", "--param", "c=5", "--lr", "0.1", "0.5", "--wd", "1e-3",
                 "--steps", "300", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "eos_entry_step" in out and len(out.strip().splitlines()) >= 3


def test_sharpness_drop_does_not_depend_on_the_record_grid():
    """The drop from coarse records equals the one read off records at every step.

    Oracle: the same runs with the sharpness recorded at every step (and one step
    more): the peak up to the exact entry step minus the mean of the last two steps.
    The old definition (sharpness at the entry record minus the smallest after it)
    was off by up to 2.5x here: right after entry sharpness falls within a few hundred
    steps, and the entry record lags the entry by 0..sharpness_every steps, a lag
    that jumps between neighbouring grid points (the checkerboard of the demo's map).
    """
    model = ps.BNLinearRegression.synthetic()
    lr, wds, steps = 2.0, np.geomspace(2.5e-4, 8e-4, 6), 3000
    ds = ps.sweep("bn_linear_regression", lr=lr, wd=wds, seeds=[0], init_norm=10.0, steps=steps,
                  sharpness_every=500, progress=False)
    got = ds.sharpness_drop.values.ravel()
    w0 = model.random_point(seed=0)
    fine = ps.run_gd_wd(model, np.broadcast_to(w0 * 10 / np.linalg.norm(w0), (6, model.dim)),
                        lr, wds, steps + 1, record_every=steps + 1, sharpness_every=1)
    S, entry = fine.sharpness, fine.eos_entry_step
    assert np.all((entry > 500) & (entry < steps))  # all resolved by the coarse records
    oracle = [S[:e + 1, j].max() - 0.5 * (S[steps, j] + S[steps + 1, j])
              for j, e in enumerate(entry)]
    np.testing.assert_allclose(got, oracle, rtol=0.02)
    assert np.all(np.diff(got) > 0)  # smooth: it grows with wd, no alternation


def test_sweep_summary_median_skips_nan_without_a_warning():
    """A sweep whose every sharpness drop is NaN reports null, silently (it warned before)."""
    import warnings

    import xarray as xr

    from pysharp.cli import _sweep_summary

    ds = xr.Dataset({"diverged": ("t", [False, False]), "eos_entry_step": ("t", [5, 7]),
                     "sharpness_drop": ("t", [np.nan, np.nan]),
                     "cosine_min_norm": ("t", [0.5, np.nan])},
                    attrs={"chunks_computed": 1, "chunks_reused": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = _sweep_summary(ds, 1.0)
    assert s["median_sharpness_drop"] is None and s["median_cosine_min_norm"] == 0.5


# -- argument checks before the store, default settings and summaries ------------------
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"lr": [0.0, 0.1]}, ValueError, "lr must be > 0"),
    ({"seeds": [1e19]}, ValueError, "seeds"),
    ({"seeds": [2 ** 63]}, ValueError, "seeds"),
    ({"init_norm": [0.0, 1.0]}, ValueError, "init_norm"),
    ({"progress": "yes"}, TypeError, "progress"),
    ({"steps": 0}, ValueError, "steps"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"eos_tol": -1e-300}, ValueError, "eos_tol"),
])
def test_sweep_rejects_bad_arguments_before_creating_the_store(tmp_path, kwargs, exc, match):
    pytest.importorskip("zarr")
    store = tmp_path / "s.zarr"
    args = {"lr": 0.1, "wd": 0.01, "steps": 10, "progress": False} | kwargs
    with pytest.raises(exc, match=match):
        ps.sweep("toy3d", store=store, **args)
    assert not store.exists()


def test_seeds_takes_the_seeds_themselves_never_a_bare_number(tmp_path):
    """``seeds=4`` reads as four seeds as readily as seed 4: refused, in the API and in a
    config, saying both spellings; a list or a range is the seeds themselves, in order."""
    from pysharp.sweeps._config import load_config

    args = {"lr": 0.1, "wd": 0.01, "steps": 10, "progress": False}
    for bare in (4, np.int64(4), np.array(4)):
        with pytest.raises(TypeError, match=r"seeds takes the seeds themselves: range\(4\) "
                                            r"for the 4 seeds 0 to 3, \[4\] for seed 4 alone"):
            ps.sweep("toy3d", seeds=bare, **args)
    with pytest.raises(TypeError, match=r"\[0\] for seed 0 alone"):
        ps.sweep("toy3d", seeds=0, **args)
    assert ps.sweep("toy3d", seeds=range(3), **args).seed.values.tolist() == [0, 1, 2]
    assert ps.sweep("toy3d", seeds=[4], **args).seed.values.tolist() == [4]
    assert ps.sweep("toy3d", **args).seed.values.tolist() == [0]
    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nname = 'toy3d'\n[grid]\nlr = 0.1\nwd = 1e-3\nseeds = 4\n"
                   "[run]\nsteps = 10\n")
    with pytest.raises(ValueError, match=r"grid.seeds takes the seeds themselves: "
                                         r"\{ range = 4 \} for the 4 seeds 0 to 3, \[4\]"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace("seeds = 4", "seeds = { range = 4 }"))
    assert load_config(cfg)["seeds"].tolist() == [0, 1, 2, 3]


def test_no_doc_passes_seeds_a_bare_number():
    root = Path(__file__).resolve().parents[2]
    pages = [*(root / "docs").rglob("*.rst"), root / "README.md"]
    if not (root / "docs").is_dir():
        pytest.skip("docs/ not next to the tests")
    found = [(p.name, m[0]) for p in pages if p.is_file()  # in code: followed by , or )
             for m in re.finditer(r"seeds\s*=\s*\d+\s*[,)]", p.read_text())]
    assert found == []


def test_a_figure_title_names_a_model_instance_by_its_data_shapes():
    from pysharp.sweeps._plot import settings_text

    model = ps.BNLinearRegression.synthetic(d=6, n=5, seed=0)
    ds = ps.sweep(model, lr=[0.1, 0.2], wd=[1e-3], steps=20, progress=False)
    assert settings_text(ds) == ("bn_linear_regression(X 5x6, y 5), gd_wd; grid: lr x2, "
                                 "wd 0.001, seed 0, init_norm 1; steps 20, record_every 1, "
                                 "sharpness_every 1")
    spec = ps.sweep({"name": "bn_linear_regression", "d": 6, "n": 5}, lr=[0.1], wd=[1e-3],
                    steps=20, progress=False)
    assert settings_text(spec).startswith("bn_linear_regression(d=6, n=5), gd_wd;")


def test_sweep_refuses_a_store_path_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ps.sweep("toy3d", lr=0.1, wd=0.01, steps=10, store=path, progress=False)
    assert path.read_text() == "x"


def test_sweep_defaults_and_summaries_against_its_own_records_and_a_raw_run():
    pytest.importorskip("xarray")
    model = ps.Toy3D(c=4.0)
    ds = ps.sweep(model, lr=[0.05, 0.4], wd=[0.0, 0.02], seeds=[0, 1], init_norm=1.5, steps=200,
                  progress=False)
    assert np.array_equal(ds["step"], np.arange(0, 201, 2))  # steps // 100
    assert np.array_equal(ds["sharpness_step"], np.arange(0, 201, 10))  # steps // 20
    sharp = ds["sharpness"].values
    assert np.array_equal(ds["final_sharpness"].values, sharp[..., -1])
    assert np.array_equal(ds["min_sharpness"].values, np.nanmin(sharp, axis=-1))
    assert np.array_equal(ds["final_loss"].values, ds["loss"].values[..., -1])
    assert np.array_equal(ds["final_eff_lr"].values, ds["eff_lr"].values[..., -1])
    # one grid point against run_gd_wd from the documented start
    w0 = model.random_point(seed=1)
    w0 = 1.5 * w0 / np.linalg.norm(w0)
    tr = ps.run_gd_wd(model, w0, 0.05, 0.02, 200, record_every=2, sharpness_every=10)
    point = ds.sel(lr=0.05, wd=0.02, seed=1, init_norm=1.5)
    assert np.allclose(point["loss"], tr.loss, rtol=1e-12, atol=1e-15)
    assert np.allclose(point["sharpness"], tr.sharpness, rtol=1e-9)
    assert int(point["eos_entry_step"]) == int(tr.eos_entry_step)
    assert float(point["final_sharpness"]) == pytest.approx(tr.sharpness[-1], rel=1e-9)


def test_sweep_records_its_default_settings_and_resumes_the_progress_count(tmp_path, monkeypatch):
    pytest.importorskip("zarr")
    import json

    from pysharp.sweeps import _sweep

    seen = []

    class Recorder:
        def __init__(self, enabled, total, initial):
            seen.append((enabled, total, initial))

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setattr(_sweep, "_Progress", Recorder)
    args = dict(lr=[0.05, 0.1, 0.2], wd=0.01, steps=40, store=tmp_path / "s.zarr", chunk_size=2)
    ds = ps.sweep("toy3d", **args)
    settings = json.loads(ds.attrs["pysharp_sweep"])["settings"]
    assert settings["eos_tol"] == 0.05 and settings["jitter"] == 0.0
    assert settings["record_every"] == 1 and settings["sharpness_every"] == 2
    again = ps.sweep("toy3d", **args)
    assert again.attrs["chunks_reused"] == 2 and again.attrs["chunks_computed"] == 0
    assert seen == [(True, 3, 0), (True, 3, 3)]  # resumed: the bar starts at 3 trajectories



def test_sigint_during_store_io_is_raised_after_it():
    """Ctrl-C inside the deferred block is held until the block ends, then raised."""
    from pysharp.sweeps._sweep import _sigint_deferred
    done = []
    with pytest.raises(KeyboardInterrupt):
        with _sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    with _sigint_deferred():  # no signal: nothing raised
        pass


def test_check_memory_counts_the_chunks_in_flight():
    """Each chunk holds _CHUNK_WORK times its results while it runs: a chunk of 100
    trajectories of 1 kB each needs more than 100 kB."""
    from pysharp.sweeps._sweep import _CHUNK_WORK, check_memory
    layout = {"w": ((128,), np.float64)}  # 1 kB per trajectory
    need = _CHUNK_WORK * 100 * 1024
    check_memory(layout, (100,), 100, in_memory=False, available=4 * need)
    with pytest.raises(MemoryError):
        check_memory(layout, (100,), 100, in_memory=False, available=need // 2)


def test_a_sweep_records_the_backend_that_ran_it():
    if not ps.backends()["numba"]["available"]:
        pytest.skip("needs the Numba backend")
    ds = ps.sweep({"name": "toy3d"}, lr=[0.1], wd=[0.01], steps=4, sharpness_every=0,
                  backend="numba", progress=False)
    assert ds.attrs["backend"] == "numba"
    assert ps.sweep({"name": "toy3d"}, lr=[0.1], wd=[0.01], steps=4, sharpness_every=0,
                    progress=False).attrs["backend"] == "cpp"


def test_open_sweep_refuses_a_directory_that_is_not_a_store(tmp_path):
    pytest.importorskip("zarr")
    (tmp_path / "notes.txt").write_text("not a store")
    with pytest.raises(ValueError, match="is not a Zarr store"):
        ps.open_sweep(tmp_path)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None: gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of every process whose parent is ``pid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (_proc_stat(int(entry)) or [None, None])[1] == str(pid):
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().decode(
                    errors="replace").replace("\0", " ")
            except OSError:
                pass
    return out


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has exited


_LONG_SWEEP = """
[model]
name = "toy3d"
[grid]
lr = { geomspace = [0.01, 0.05, 256] }
wd = [1e-3]
[run]
steps = 100000
sharpness_every = 0
chunk_size = 4
[output]
store = "long.zarr"
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc (Linux)")
def test_sigkill_of_the_cli_parent_ends_its_workers_and_the_resource_tracker(tmp_path):
    """``kill -9`` of ``pysharp sweep --workers 2`` mid-run: its two workers (blocked on the
    pool's pipe, whose writing end they hold too) and multiprocessing's resource tracker
    (which waits for every holder of its pipe) must be gone within seconds, not linger."""
    pytest.importorskip("zarr")
    (tmp_path / "long.toml").write_text(_LONG_SWEEP)
    proc = subprocess.Popen([sys.executable, "-m", "pysharp", "sweep", "long.toml", "--workers",
                             "2", "--no-progress"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    children: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        done = tmp_path / "long.zarr" / "_pysharp_done"
        while time.monotonic() < deadline and proc.poll() is None:  # both workers at work
            children = _children(proc.pid)
            if (sum("spawn_main" in c for c in children.values()) == 2
                    and any("resource_tracker" in c for c in children.values())
                    and done.is_dir() and any(done.glob("[0-9]*.json"))):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert len(children) == 3, children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(_alive, children)):
            time.sleep(0.05)
        left = {pid: cmd for pid, cmd in children.items() if _alive(pid)}
        assert not left, f"alive 10 s after their parent was killed: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
