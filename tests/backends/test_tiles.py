"""The fused GD+WD tiles as the engine's ``run`` (pysharp._backends._tiles): which runs they
take, and that their records are the engine's, checked through pysharp._core's CPU
emulation of the same tiles (the cuda backend runs them from pysharp._cuda)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pysharp as ps
from pysharp._backends import BACKENDS
from pysharp._backends._tiles import applies, tile_run
from pysharp._engine import EngineConfig, LanczosOptions, Method

_core = pytest.importorskip("pysharp._core")


def _config(D, steps=200, every=10, sharpness_every=0, max_iter=None, **kw):
    lz = LanczosOptions.for_dim(D, 1, max_iter, tol=1e-10, seed=0, name="lanczos_max_iter")
    return EngineConfig(Method.GD_WD, steps=steps, record_every=every,
                        sharpness_every=sharpness_every, lanczos=lz, **kw)


def _assert_engines_records(got, ref, tol=1e-10):
    """got (a tile run) has ref's (the CPU engine's) keys, shapes and dtypes; its NaNs where
    ref has them; floats within tol of ref's scale; integers and flags equal."""
    assert got.keys() == ref.keys()
    for key, want in ref.items():
        have = got[key]
        assert have.shape == want.shape and have.dtype == want.dtype, key
        if have.size and have.dtype.kind == "f":
            np.testing.assert_array_equal(np.isnan(have), np.isnan(want), err_msg=key)
            scale = np.nanmax(np.abs(want), initial=0.0)
            assert np.nanmax(np.abs(have - want), initial=0.0) <= tol * scale, key
        else:
            np.testing.assert_array_equal(have, want, err_msg=key)


def _case(name):
    if name == "toy3d":
        model, B = ps.Toy3D(c=10.0), 9
    elif name == "bn_mc":  # D 80: a thread per trajectory
        model, B = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=4, seed=0), 5
    elif name == "bn_mc D800":  # a warp per trajectory
        model, B = ps.BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0), 3
    else:
        model, B = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0), 11
    W0 = np.random.default_rng(1).standard_normal((B, model.dim))
    # Before EoS entry, where two code paths agree to rounding (Toy3D's EoS ratios stay
    # below 0.5; at 10x its learning rates they reach 4.8)
    lr_max = 0.01 if name == "toy3d" else 0.2
    hyper = {"lr": np.linspace(lr_max / 10, lr_max, B), "wd": np.full(B, 1e-3)}
    return model, W0, hyper


@pytest.mark.parametrize("name", ["toy3d", "bn_linreg", "bn_mc", "bn_mc D800"])
def test_tile_records_are_the_engines(name):
    model, W0, hyper = _case(name)
    config = _config(model.dim)
    got = tile_run(model, config, W0, hyper, _core)
    ref = model._core(np.dtype(np.float64), "cpp").run(W0, hyper, config.to_core())
    _assert_engines_records(got, ref)


# (steps, record_every, sharpness_every, Lanczos max_iter): the last segment short or of no
# step; sharpness steps off the records (25 and 7 against 10; 30 against 4, 203 steps); a
# Krylov space of 3, where the eigenvalue a solve returns depends on its start (the random
# one keyed by trajectory and step, then the warm one), so that a start other than the
# engine's shows.
@pytest.mark.parametrize("steps, rec_every, every, max_iter", [
    (200, 10, 50, None), (190, 10, 30, None), (200, 10, 20, 3), (200, 10, 25, None),
    (200, 10, 7, None), (203, 4, 30, None)])
@pytest.mark.parametrize("name", ["toy3d", "bn_linreg", "bn_mc", "bn_mc D800"])
def test_tile_records_with_sharpness_are_the_engines(name, steps, rec_every, every,
                                                     max_iter):
    model, W0, hyper = _case(name)
    if max_iter and model.dim <= max_iter:
        pytest.skip("a Krylov space of 3 is all of Toy3D's")
    config = _config(model.dim, steps, rec_every, every, max_iter)
    core = model._core(np.dtype(np.float64), "cpp")
    got = tile_run(model, config, W0, hyper, _core, core, first_trajectory=5)
    ref = core.run(W0, hyper, config.to_core(), 5)
    assert np.isfinite(ref["sharpness"]).all() and np.isfinite(ref["top_grad"]).all()
    assert np.max(ref["eos_ratio"]) < 1  # before EoS entry
    _assert_engines_records(got, ref)
    if max_iter:  # the streams matter here: row b is trajectory 5 + b
        other = tile_run(model, config, W0, hyper, _core, core, first_trajectory=0)
        assert np.max(np.abs(other["sharpness"] - ref["sharpness"])) > 1e-6 * np.max(
            np.abs(ref["sharpness"]))


# record_every, sharpness_every: 103 in a call that records, in one that only takes rows to
# the next sharpness step (records every 40), and after such a call's one step (records at
# multiples of 7)
@pytest.mark.parametrize("rec_every, every", [(10, 50), (40, 30), (7, 30)])
def test_tile_sharpness_runs_freeze_diverging_trajectories_as_the_engine(rec_every, every):
    """A row undefined at its start, one whose update overflows within the first segment,
    one past it, and one whose Lanczos fails at a sharpness step: flagged at the engine's
    steps, their records NaN from there, the other rows' as in the engine. The tiles do not
    rescale: they flag a row once ||w||^2 leaves the format (rows 2 and 3), the engine once
    w itself does (docs/conventions.rst); a start outside the safe range is not theirs."""
    model = ps.Toy3D(c=10.0)
    W0 = np.random.default_rng(3).standard_normal((6, 3))
    W0[1] = 0.0                                   # undefined at step 0 (the Lanczos fails)
    lr, wd = np.linspace(0.002, 0.01, 6), np.full(6, 1e-3)  # EoS ratios below 1
    lr[2], wd[2] = 1e200, 1.0                     # ||w||^2 overflows after step 0
    lr[3], wd[3] = 1e-3, -3e4                     # w grows 31-fold a step: at 103
    config = _config(3, 300, rec_every, every)
    core = model._core(np.dtype(np.float64), "cpp")
    hyper = {"lr": lr, "wd": wd}
    ref = core.run(W0, hyper, config.to_core())
    got = tile_run(model, config, W0, hyper, _core, core)
    assert got["diverged_step"].tolist() == [-1, 0, 1, 103, -1, -1]  # 103: mid-segment
    assert ref["diverged_step"].tolist() == [-1, 0, 2, 207, -1, -1]
    assert np.nanmax(ref["eos_ratio"][:, [0, 4, 5]]) < 1  # before EoS entry
    _assert_engines_records(_rows(got, [0, 1, 4, 5]), _rows(ref, [0, 1, 4, 5]))
    huge = np.vstack([W0, 1e160 * W0[:1]])        # ||w0||^2 overflows: the engine's alone
    wide = {"lr": np.append(lr, lr[0]), "wd": np.append(wd, wd[0])}
    assert tile_run(model, config, huge, wide, _core, core) is None
    alone = core.run(huge, wide, config.to_core())
    assert alone["diverged"][6] == 0
    # its effective LR is ~1e-321: it stays at its start's sharpness
    np.testing.assert_allclose(alone["sharpness"][:, 6], ref["sharpness"][0, 0], rtol=1e-12)
    if (rec_every, every) != (10, 50):
        return
    # A core whose Lanczos fails for row 4 at step 100: flagged there, w kept from step 100.
    failing = _FailingLanczos(core, row=4, at=100)
    got = tile_run(model, config, W0, hyper, _core, failing)
    assert got["diverged"][4] == 1 and got["diverged_step"][4] == 100
    assert np.isnan(got["loss"][10:, 4]).all() and np.isfinite(got["loss"][:10, 4]).all()
    assert np.isnan(got["sharpness"][2:, 4]).all() and np.isfinite(got["sharpness"][:2, 4]).all()
    upto = tile_run(model, _config(3, 100, 10, 50), W0[4:5], {"lr": lr[4:5], "wd": wd[4:5]},
                    _core, core, first_trajectory=4)
    np.testing.assert_array_equal(got["w"][4], upto["w"][0])


def _rows(records: dict, rows: list[int]) -> dict:
    """The records of the trajectories ``rows`` alone: (B, ...) for w and the flags,
    (records, B, ...) for the rest."""
    first = ("w", "diverged", "diverged_step")
    return {k: v[rows] if k in first else v[:, rows] for k, v in records.items()}


class _FailingLanczos:
    """A model core whose Lanczos reports failure (ok = 0) for trajectory ``row`` at step
    ``at`` and is the given core's otherwise."""

    def __init__(self, core, row, at):
        self.core, self.row, self.at = core, row, at

    def lanczos(self, W, options, start=None, streams=None, counter=0):
        out = list(self.core.lanczos(W, options, start, streams=streams, counter=counter))
        if counter == self.at:
            out[5] = np.where(np.asarray(streams) == self.row, 0, out[5]).astype(np.uint8)
        return tuple(out)


def test_what_a_tile_does_not_record_is_left_to_the_engine():
    D = 3
    assert applies(_config(D), np.float64)
    assert applies(_config(D, sharpness_every=30), np.float64)
    assert applies(_config(D, sharpness_every=15), np.float64)  # off the record steps too
    for change in ({"theta_every": 5}, {"jitter": 1e-3},
                   {"top_k": 2}, {"reduced": True}, {"method": Method.PGD}):
        assert not applies(dataclasses.replace(_config(D), **change), np.float64), change
    assert not applies(_config(D), np.float32)
    # Sharpness tracking needs the engine's Lanczos: without a core, no tile.
    model, W0, hyper = _case("toy3d")
    assert tile_run(model, _config(3, sharpness_every=50), W0, hyper, _core) is None


def test_models_without_a_tile_get_none():
    _, W0, hyper = _case("bn_linreg")
    off_shape = ps.BNLinearRegression.synthetic(d=6, n=4, seed=0)  # no tile compiled for it
    assert tile_run(off_shape, _config(6), W0[:, :6], hyper, _core) is None
    # 2 D + N + 1 = 29201 doubles: one warp's scratch (228 KB) is over a block's shared
    # memory
    mc = ps.BNMatrixCompletion.synthetic(size=100, true_rank=2, rank=72, n_obs=400, seed=0)
    assert not _core._tile_bn_mc_warp_fits(mc.dim, mc.n_obs)
    W = mc.random_point(2, seed=0)
    assert tile_run(mc, _config(mc.dim), W, {"lr": np.full(2, 0.1), "wd": np.zeros(2)},
                    _core) is None


def test_bn_mc_takes_the_thread_tile_up_to_the_largest_scratch_it_accepts():
    """The model's size test and the kernel's agree at the edge: 2 D + N = 510 runs on the
    thread tile, 511 on the warp tile (and is refused by the thread tile)."""
    lr, wd = np.full(1, 0.1), np.zeros(1)
    for n_obs, thread in ((30, True), (31, False)):  # D = 2 * 10 * 12 = 480
        mc = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=12, n_obs=n_obs, seed=0)
        assert 2 * mc.dim + mc.n_obs == 480 + n_obs
        kernel = mc._tile_kernel(_core)
        want = _core._tile_bn_mc_gd_wd if thread else _core._tile_bn_mc_warp_gd_wd
        assert kernel.func is want
        args = (mc.rows, mc.cols, mc._u, mc._scale, 10, 10, 12, mc.random_point(1, seed=0),
                lr, wd, 1, 1)
        assert kernel(*args[7:])[3].tolist() == [0]
        if not thread:
            with pytest.raises(ValueError, match="too large"):
                _core._tile_bn_mc_gd_wd(*args)


def test_bn_mc_warp_tile_takes_what_one_warps_scratch_fits():
    """The warp tile's edge, 2 D + N + 1 doubles in a block's shared memory (227 KB
    emulated): one double more is refused by the size test and the launcher alike."""
    optin = 232448 // 8  # doubles, even
    assert _core._tile_bn_mc_warp_fits((optin - 4) // 2, 3)
    assert not _core._tile_bn_mc_warp_fits((optin - 4) // 2, 4)
    assert not _core._tile_bn_mc_warp_fits(10, 1)
    mc = ps.BNMatrixCompletion.synthetic(size=100, true_rank=2, rank=72, n_obs=400, seed=0)
    with pytest.raises(ValueError, match="too large"):
        _core._tile_bn_mc_warp_gd_wd(mc.rows, mc.cols, mc._u, mc._scale, 100, 100, 72,
                                     mc.random_point(1, seed=0), np.full(1, 0.1), np.zeros(1),
                                     1, 1)


def test_bn_mc_asks_the_module_what_fits():
    """The device decides (its shared memory per block): a module that says no to both tiles
    leaves the run to the engine instead of failing in the launch; one that says no to the
    thread tile only gets the warp tile."""
    import types

    model, W0, hyper = _case("bn_mc")
    asked = []
    small_gpu = types.SimpleNamespace(
        _tile_bn_mc_fits=lambda D, N: asked.append(("thread", D, N)) or False,
        _tile_bn_mc_warp_fits=lambda D, N: asked.append(("warp", D, N)) or False)
    assert tile_run(model, _config(model.dim), W0, hyper, small_gpu) is None
    assert asked == [("thread", model.dim, model.n_obs), ("warp", model.dim, model.n_obs)]
    warp_only = types.SimpleNamespace(
        _tile_bn_mc_fits=lambda D, N: False, _tile_bn_mc_warp_fits=lambda D, N: True,
        _tile_bn_mc_warp_gd_wd=_core._tile_bn_mc_warp_gd_wd)
    ref = tile_run(model, _config(model.dim), W0, hyper, _core)
    got = tile_run(model, _config(model.dim), W0, hyper, warp_only)
    assert np.max(np.abs(got["w"] - ref["w"])) <= 1e-12 * np.max(np.abs(ref["w"]))


def test_a_backend_with_tiles_takes_them_where_they_apply(monkeypatch):
    """run_gd_wd on a backend whose ``tiles`` names a module: the tiles for a run they cover
    (meta["tiles"], records within 1e-10 of the engine's), the engine for one they do not."""
    model, W0, hyper = _case("toy3d")
    lanes = ps.run_gd_wd(model, W0, hyper["lr"], hyper["wd"], 200, record_every=10,
                         sharpness_every=0, backend="cpp")
    monkeypatch.setitem(BACKENDS, "cpp", dataclasses.replace(BACKENDS["cpp"],
                                                             tiles=lambda: _core))
    tiled = ps.run_gd_wd(model, W0, hyper["lr"], hyper["wd"], 200, record_every=10,
                         sharpness_every=0, backend="cpp")
    assert tiled.meta["tiles"] and not lanes.meta["tiles"]
    for key in ("w", "loss", "norm2", "eff_lr", "grad_norm"):
        want = getattr(lanes, key)
        assert np.max(np.abs(getattr(tiled, key) - want)) <= 1e-10 * np.max(np.abs(want))
    assert tiled.sharpness.shape == lanes.sharpness.shape == (0, len(W0))
    tracked = ps.run_gd_wd(model, W0, hyper["lr"], hyper["wd"], 200, record_every=10,
                           sharpness_every=50, backend="cpp", first_trajectory=2)
    assert tracked.meta["tiles"] and np.isfinite(tracked.sharpness).all()
    snapshots = ps.run_gd_wd(model, W0, hyper["lr"], hyper["wd"], 200, record_every=10,
                             sharpness_every=25, theta_every=50, backend="cpp")
    assert not snapshots.meta["tiles"]
    monkeypatch.setitem(BACKENDS, "cpp", dataclasses.replace(BACKENDS["cpp"], tiles=None))
    engine = ps.run_gd_wd(model, W0, hyper["lr"], hyper["wd"], 200, record_every=10,
                          sharpness_every=50, backend="cpp", first_trajectory=2)
    for key in ("sharpness", "eos_ratio", "top_grad", "loss"):
        want = getattr(engine, key)
        assert np.max(np.abs(getattr(tracked, key) - want)) <= 1e-10 * np.max(np.abs(want))


def test_lanczos_keys_its_starts_by_the_given_streams_and_counter():
    """The core's ``lanczos`` with streams and counter (what a segmented tile run passes):
    row b's random start is that of trajectory streams[b] at step counter, wherever the row
    sits in the batch. A Krylov space of 3 leaves the eigenvalue dependent on the start."""
    model = ps.BNMatrixCompletion.synthetic(size=10, true_rank=2, rank=4, seed=0)
    core = model._core(np.dtype(np.float64), "cpp")
    W = model.random_point(10, seed=1)
    options = LanczosOptions.for_dim(model.dim, 1, 3, seed=4).to_core()
    whole = core.lanczos(W, options, counter=40)
    pick = [7, 2, 9, 4, 1, 8, 0, 5, 3]  # more rows than a lane block (4 or 8)
    some = core.lanczos(W[pick], options, streams=np.array(pick, np.uint64), counter=40)
    for a, b in zip(some, whole):
        np.testing.assert_array_equal(a, b[pick])
    later = core.lanczos(W, options, counter=41)
    unkeyed = core.lanczos(W[pick], options, counter=40)  # streams 0, 1, ...
    assert not np.array_equal(later[0], whole[0])
    assert not np.array_equal(unkeyed[0], some[0])
    with pytest.raises(ValueError, match="streams"):
        core.lanczos(W, options, streams=np.arange(3, dtype=np.uint64))
