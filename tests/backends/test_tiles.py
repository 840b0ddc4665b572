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


def _config(D, steps=200, every=10, **kw):
    lz = LanczosOptions.for_dim(D, 1, None, tol=1e-10, seed=0, name="lanczos_max_iter")
    return EngineConfig(Method.GD_WD, steps=steps, record_every=every, sharpness_every=0,
                        lanczos=lz, **kw)


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
    hyper = {"lr": np.linspace(0.02, 0.2, B), "wd": np.full(B, 1e-3)}
    return model, W0, hyper


@pytest.mark.parametrize("name", ["toy3d", "bn_linreg", "bn_mc", "bn_mc D800"])
def test_tile_records_are_the_engines(name):
    model, W0, hyper = _case(name)
    config = _config(model.dim)
    got = tile_run(model, config, W0, hyper, _core)
    ref = model._core(np.dtype(np.float64), "cpp").run(W0, hyper, config.to_core())
    assert got.keys() == ref.keys()
    for key, want in ref.items():
        have = got[key]
        assert have.shape == want.shape and have.dtype == want.dtype, key
        if have.size and have.dtype.kind == "f":
            scale = np.max(np.abs(want))
            assert np.max(np.abs(have - want)) <= 1e-10 * scale, key
        else:
            np.testing.assert_array_equal(have, want, err_msg=key)


def test_what_a_tile_does_not_record_is_left_to_the_engine():
    D = 3
    assert applies(_config(D), np.float64)
    for change in ({"sharpness_every": 10}, {"theta_every": 5}, {"jitter": 1e-3},
                   {"top_k": 2}, {"reduced": True}, {"method": Method.PGD}):
        assert not applies(dataclasses.replace(_config(D), **change), np.float64), change
    assert not applies(_config(D), np.float32)


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
                           sharpness_every=50, backend="cpp")
    assert not tracked.meta["tiles"] and np.isfinite(tracked.sharpness).all()
