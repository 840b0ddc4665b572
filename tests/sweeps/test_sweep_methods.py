"""Sweeps of every method: projected GD, scalar RMSprop and SGD beside GD+WD.

Each grid point is checked against the ``pysharp.run_*`` call it stands for (with
``chunk_size=1`` every chunk is one lone run, keyed by its flat index through
``first_trajectory``: the same code path, so the same bits); the end sharpness
against the engine's own next iterate; the SGD stability verdict against
``pysharp.stability`` and against what SGD actually does.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import pysharp as ps
from pysharp import stability
from pysharp.sharpness import spherical_sharpness
from pysharp.sweeps import StoreMismatch, _sweep
from pysharp.sweeps._config import parse

xr = pytest.importorskip("xarray")

BN = {"name": "bn_linear_regression", "d": 12, "n": 8, "seed": 1}

#: method -> (grid, run settings): small grids where some points enter EoS after the
#: first sharpness record, so that sharpness_drop is defined somewhere.
GD_CASES = {
    "gd_wd": (dict(lr=[0.1, 0.5], wd=[1e-2], seeds=[0, 3]),
              dict(steps=600, record_every=50, sharpness_every=10)),
    "pgd": (dict(lr=[0.45, 0.6], seeds=[0]),
            dict(steps=300, record_every=10, sharpness_every=1)),
    "scalar_rmsprop": (dict(lr=[0.05, 0.1], wd=[1e-3], seeds=[0, 3]),
                       dict(steps=600, record_every=50, sharpness_every=50)),
}


def _start(model, seed: int, norm: float) -> np.ndarray:
    """w0 (1, D) as the sweep documents it: the direction of random_point(seed) at norm."""
    w = model.random_point(seed=seed)[None]
    return w * (np.array([norm]) / np.linalg.norm(w, axis=1))[:, None]


def _lone(method, model, w0, lr, wd, run, k):
    common = dict(record_every=run["record_every"], sharpness_every=run["sharpness_every"],
                  first_trajectory=k)
    if method == "pgd":
        return ps.run_pgd(model, w0, [lr], run["steps"], **common)
    if method == "scalar_rmsprop":
        return ps.run_scalar_rmsprop(model, w0, [lr], [wd], run["steps"], **common)
    return ps.run_gd_wd(model, w0, [lr], [wd], run["steps"], **common)


@pytest.mark.parametrize("method", sorted(GD_CASES))
def test_gd_methods_each_point_is_its_lone_run(method):
    grid, run = GD_CASES[method]
    ds = ps.sweep(BN, method=method, **grid, **run, chunk_size=1, progress=False)
    assert ds.loss.dims == ("lr", "wd", "seed", "init_norm", "step")
    assert json.loads(ds.attrs["pysharp_sweep"])["method"] == method
    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    wds = grid.get("wd", [0.0])
    drops = 0
    for k, (lr, wd, seed) in enumerate(itertools.product(grid["lr"], wds, grid["seeds"])):
        w0 = _start(model, seed, 1.0)
        tr = _lone(method, model, w0, lr, wd, run, k)
        p = ds.sel(lr=lr, wd=wd, seed=seed, init_norm=1.0)
        for name in ("loss", "norm2", "eff_lr", "sharpness", "eos_ratio"):
            assert p[name].values.tobytes() == getattr(tr, name)[:, 0].tobytes(), name
        assert int(p.eos_entry_step) == tr.eos_entry_step[0]
        assert float(p.final_loss) == tr.loss[-1, 0]
        assert float(p.final_sharpness) == tr.sharpness[-1, 0]
        assert bool(p.diverged) == tr.diverged[0]
        if method == "pgd":  # the lr axis is the constant effective LR
            np.testing.assert_array_equal(p.eff_lr.values, lr)
        drop = float(p.sharpness_drop)
        if np.isnan(drop):
            continue
        drops += 1
        # oracle: the engine's own step T + 1 (not GD+WD's), sharpness by dense eigensolver
        T = run["steps"]
        nxt = _lone(method, model, w0, lr, wd, dict(run, steps=T + 1, sharpness_every=0), k)
        end = 0.5 * sum(spherical_sharpness(model, w, method="dense").eigenvalues[0]
                        for w in (tr.w[0], nxt.w[0]))
        upto = tr.sharpness_steps <= tr.eos_entry_step[0]
        assert drop == pytest.approx(np.max(tr.sharpness[upto, 0]) - end, rel=1e-7, abs=1e-9)
    assert drops > 0


def test_rmsprop_end_step_is_not_the_gd_wd_step():
    """The oracle above can tell the methods' steps apart: GD+WD's step from an RMSprop
    end point lands elsewhere (so a sweep using it would fail that test)."""
    from pysharp.sweeps._compute import end_sharpness

    model = ps.BNLinearRegression.synthetic(d=12, n=8, seed=1)
    tr = ps.run_scalar_rmsprop(model, _start(model, 3, 1.0), [0.05], [1e-3], 600,
                               record_every=50, sharpness_every=0)
    own = end_sharpness(model, tr.w, tr.lr, tr.wd, eff_lr=tr.eff_lr[-1])
    gd = end_sharpness(model, tr.w, tr.lr, tr.wd)
    assert abs(own[0] - gd[0]) > 1e-6 * abs(own[0])


SGD_MODELS = {
    "linear_regression": {"name": "linear_regression", "d": 4, "n": 8, "seed": 0},
    "two_layer_net": {"name": "two_layer_net", "d": 3, "m": 4, "n": 6, "seed": 0},
    "bn_linear_regression": {"name": "bn_linear_regression", "d": 6, "n": 8, "seed": 1},
}
SGD_GRID = dict(lr=[0.05, 0.4], batch=[2, 4], wd=[0.0, 1e-3], seeds=[0, 1])
SGD_RUN = dict(steps=300, record_every=20)


@pytest.mark.parametrize("name", sorted(SGD_MODELS))
def test_sgd_each_point_is_its_lone_run_and_rho_is_stabilitys(name):
    spec = SGD_MODELS[name]
    ds = ps.sweep(spec, method="sgd", **SGD_GRID, **SGD_RUN, chunk_size=1, progress=False)
    assert ds.loss.dims == ("lr", "batch", "wd", "seed", "init_norm", "step")
    assert "sharpness_step" not in ds.dims
    model = ps.sweeps.MODELS[name].factory(**{k: v for k, v in spec.items() if k != "name"})
    points = itertools.product(SGD_GRID["lr"], SGD_GRID["batch"], SGD_GRID["wd"],
                               SGD_GRID["seeds"])
    for k, (lr, batch, wd, seed) in enumerate(points):
        res = ps.run_sgd(model, _start(model, seed, 1.0), [lr], [batch], SGD_RUN["steps"],
                         wd=[wd], record_every=SGD_RUN["record_every"], first_trajectory=k)
        p = ds.sel(lr=lr, batch=batch, wd=wd, seed=seed, init_norm=1.0)
        assert p.loss.values.tobytes() == res.loss[:, 0].tobytes()
        assert float(p.final_loss) == res.loss[-1, 0]
        assert bool(p.diverged) == res.diverged[0]
        assert int(p.diverged_step) == res.diverged_step[0]
        if res.diverged[0]:
            assert np.isnan(float(p.rho_T2)) and not bool(p.stable)
            continue
        op = stability.second_moment_operator(model, res.w[0], lr, batch)
        assert float(p.rho_T2) == op.spectral_radius
        assert bool(p.stable) == stability.is_linearly_stable(model, res.w[0], lr, batch)
    # chunking changes nothing, the per-row stability verdict included
    whole = ps.sweep(spec, method="sgd", **SGD_GRID, **SGD_RUN, progress=False)
    for var in ds.data_vars:
        assert ds[var].values.tobytes() == whole[var].values.tobytes(), var


def test_sgd_verdict_matches_what_sgd_does():
    """On a realizable linear regression the minimum is the teacher whatever the lr, and
    rho(T_2) decides: at half the exact critical lr SGD converges, at three times it
    diverges."""
    model = ps.LinearRegression.synthetic(d=4, n=8, seed=0)
    batch = 2
    critical = stability.critical_lr(model, model.w_true, batch)
    lrs = [0.5 * critical, 3.0 * critical]
    ds = ps.sweep(model, method="sgd", lr=lrs, batch=batch, seeds=[0, 1, 2], steps=3000,
                  progress=False)
    stable, unstable = ds.sel(lr=lrs[0]), ds.sel(lr=lrs[1])
    assert bool(stable.stable.all()) and not bool(stable.diverged.any())
    assert float(stable.final_loss.max()) < 1e-20
    assert float(stable.rho_T2.max()) < 1
    assert bool(unstable.diverged.all()) and not bool(unstable.stable.any())
    # the verdict itself, at the minimum: below 1 exactly at the stable lr only
    assert stability.second_moment_operator(model, model.w_true, lrs[0], batch
                                            ).spectral_radius < 1
    assert stability.second_moment_operator(model, model.w_true, lrs[1], batch
                                            ).spectral_radius > 1


def test_sgd_model_instances_rebuild_from_their_spec():
    by_name = ps.sweep(SGD_MODELS["two_layer_net"], method="sgd", lr=[0.1], batch=[3, 6],
                       steps=50, progress=False)
    net = ps.TwoLayerNet.synthetic(d=3, m=4, n=6, seed=0)
    rebuilt = type(net)(**{k: v for k, v in net.spec().items() if k != "model"})
    assert np.array_equal(rebuilt.y, net.y) and rebuilt.dim == net.dim
    by_instance = ps.sweep(net, method="sgd", lr=[0.1], batch=[3, 6], steps=50, progress=False)
    for var in by_name.data_vars:
        assert by_name[var].values.tobytes() == by_instance[var].values.tobytes(), var


def test_sgd_store_round_trip_and_method_in_identity(tmp_path):
    pytest.importorskip("zarr")
    spec = SGD_MODELS["linear_regression"]
    kw = dict(lr=[0.05, 0.4], batch=[1, 2, 8], seeds=[0, 1], steps=200, record_every=10,
              chunk_size=2, progress=False)
    ref = ps.sweep(spec, method="sgd", **kw)
    store = tmp_path / "sgd.zarr"
    first = ps.sweep(spec, method="sgd", store=store, **kw)
    assert first.attrs["chunks_reused"] == 0
    again = ps.sweep(spec, method="sgd", store=store, **kw)
    assert again.attrs["chunks_computed"] == 0 and again.attrs["chunks_reused"] > 0
    for got in (first, again, ps.open_sweep(store), xr.open_zarr(store)):
        assert set(got.data_vars) == set(ref.data_vars)
        for var in ref.data_vars:
            assert got[var].values.tobytes() == ref[var].values.tobytes(), var
        assert got.stable.dims == ("lr", "batch", "wd", "seed", "init_norm")
    with pytest.raises(StoreMismatch, match="settings"):
        ps.sweep(spec, method="sgd", store=store, replacement=True, **kw)
    # the same grid under another method is another sweep
    bn = tmp_path / "bn.zarr"
    common = dict(lr=[0.1], wd=0.0, steps=20, sharpness_every=10, progress=False)
    ps.sweep(BN, method="gd_wd", store=bn, **common)
    with pytest.raises(StoreMismatch, match="method"):
        ps.sweep(BN, method="pgd", store=bn, **common)


def test_lr_by_batch_heatmap():
    pytest.importorskip("matplotlib")
    from pysharp.sweeps._plot import metric_values

    ds = ps.sweep(SGD_MODELS["linear_regression"], method="sgd", lr=[0.05, 0.2, 0.4],
                  batch=[1, 2, 8], seeds=[0, 1], steps=100, progress=False)
    values, coords = metric_values(ds, "rho_T2", ["lr", "batch"])
    assert values.shape == (3, 3) and list(coords["batch"]) == [1, 2, 8]
    np.testing.assert_array_equal(values, np.nanmean(ds.rho_T2.values, axis=(2, 3, 4)))
    fig = ps.sweeps.plot(ds, x="lr", y="batch", metric=["rho_T2", "stable"], sel={"seed": 0})
    assert len(fig.axes) == 4  # two panels, two colour bars
    with pytest.raises(ValueError, match="grid axes"):
        metric_values(ds, "rho_T2", ["lr"], sel={"sharpness_step": 0})


@pytest.mark.parametrize("model, kwargs, match", [
    (BN, dict(method="adam", wd=0.0), r"method must be one of \['gd_wd', 'pgd', "
                                      r"'scalar_rmsprop', 'sgd'\]"),
    (BN, dict(method="pgd", wd=1e-3), "wd must be 0"),
    (BN, dict(method="pgd", init_norm=2.0), "init_norm must be 1"),
    (BN, dict(method="gd_wd"), "wd is required"),
    (BN, dict(method="gd_wd", wd=0.0, batch=4), "batch applies to method='sgd' only"),
    (BN, dict(method="pgd", rms_beta=0.9), "rms_beta applies to method 'scalar_rmsprop' only"),
    (BN, dict(method="scalar_rmsprop", wd=0.0, record_every=7), "must divide steps"),
    ("toy3d", dict(method="sgd", batch=2), "method='sgd' needs a square-loss model"),
    ({"name": "bn_matrix_completion", "size": 4, "rank": 1, "n_obs": 8},
     dict(method="sgd", batch=2), "'bn_matrix_completion' is not one"),
    ("linear_regression", dict(method="gd_wd", wd=0.0), "needs a scale-invariant model"),
    ("linear_regression", dict(method="sgd"), "batch is required"),
    ("linear_regression", dict(method="sgd", batch=[1, 50]), "<= n = 20"),
    (BN, dict(method="sgd", batch=[1, 4]), ">= 2"),
    ("linear_regression", dict(method="sgd", batch=2, sharpness_every=5), "records no sharpness"),
    ("linear_regression", dict(method="sgd", batch=2, jitter=0.1), "no jitter"),
])
def test_bad_method_arguments_are_refused_before_any_work(tmp_path, monkeypatch, model,
                                                          kwargs, match):
    def no_work(*args, **kw):
        raise AssertionError("a chunk ran")

    monkeypatch.setattr(_sweep, "compute_chunk", no_work)
    store = tmp_path / "s.zarr"
    with pytest.raises(ValueError, match=match):
        ps.sweep(model, lr=[0.1], steps=20, store=store, progress=False, **kwargs)
    assert not store.exists()


def test_config_takes_method_and_batch():
    cfg = {"model": {"name": "linear_regression", "d": 4, "n": 8},
           "grid": {"lr": [0.1, 0.2], "batch": {"range": [1, 4]}},
           "run": {"method": "sgd", "steps": 10, "replacement": True}}
    kwargs = parse(cfg)
    assert kwargs["method"] == "sgd" and list(kwargs["batch"]) == [1, 2, 3]
    ds = ps.sweep(**kwargs, progress=False)
    assert json.loads(ds.attrs["pysharp_sweep"])["settings"]["replacement"] is True
    with pytest.raises(ValueError, match="run.method must be one of"):
        parse({**cfg, "run": {"method": "adam", "steps": 10}})
    with pytest.raises(ValueError, match="missing grid.wd"):
        parse({**cfg, "run": {"steps": 10}})
    with pytest.raises(ValueError, match="missing grid.batch"):
        parse({**cfg, "grid": {"lr": 0.1}})


def test_sgd_memory_estimate_and_streaming(tmp_path, monkeypatch):
    """The estimate counts an SGD point's outputs exactly (the bytes of the Dataset), refuses
    an in-memory grid that does not fit, and the 5-D grid streams to a store in blocks."""
    pytest.importorskip("zarr")
    from pysharp.sweeps._store import chunk_bounds

    spec = SGD_MODELS["linear_regression"]
    kw = dict(lr=[0.05, 0.1, 0.4], batch=[1, 2], seeds=[0, 1], steps=100, record_every=10,
              progress=False)
    in_memory = ps.sweep(spec, method="sgd", **kw)
    n = in_memory.stable.size
    per = sum(v.nbytes for v in in_memory.data_vars.values()) // n
    assert per == 11 * 8 + 8 + 1 + 8 + 8 + 1  # loss (11 records), final_loss, diverged, ...
    chunk = _sweep._CHUNK_WORK * 4 * per  # chunk_size 5: blocks of whole (batch, ..) rows, 4
    # room for 1.5 chunks: the results (one chunk's worth) plus a running chunk do not fit
    monkeypatch.setattr(_sweep, "available_memory", lambda: int(1.5 * chunk / _sweep._SAFETY))
    with pytest.raises(MemoryError, match="store="):
        ps.sweep(spec, method="sgd", chunk_size=5, **kw)
    got = ps.sweep(spec, method="sgd", chunk_size=5, store=tmp_path / "s.zarr", **kw)
    assert got.attrs["chunks_computed"] == len(chunk_bounds((3, 2, 1, 2, 1), 5)) == 3
    xr.testing.assert_identical(got.compute(), in_memory.assign_attrs(got.attrs))
