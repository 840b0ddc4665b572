"""RunOptions (pysharp._engine.options) and the engines of the method table.

Each public ``run_*`` function hands its keywords down as one ``RunOptions``: the config the
compiled engine receives is checked field by field against what the keywords mean (written
out here by hand, every field away from its default), and the same options given to the
engine's runner directly give the same bits. The table's rows name the engine that runs
them; the trajectory engine's rows are the compiled ones, SGD's runner is the mini-batch one.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import loader
from pysharp._engine.methods import ALL_METHODS, ENGINES, METHODS
from pysharp._engine.options import RunOptions
from pysharp.dynamics import run_method
from pysharp.sgd import run_minibatch, run_sgd

MODEL = ps.BNLinearRegression.synthetic(d=6, n=4, seed=2)
W0 = np.stack([MODEL.random_point(seed=s, norm=3.0) for s in range(2)]).astype(np.float32)

#: Every option away from its default (dtype: float64 asked of float32 starts).
COMMON = dict(steps=12, record_every=3, sharpness_every=4, theta_every=6, seed=7,
              dtype=np.float64, backend="cpp", eos_tol=0.1, lanczos_tol=1e-8,
              lanczos_max_iter=5, first_trajectory=11, top_k=2)
#: The Lanczos options those give (min_iter: min(max_iter, max(2k + 2, 8))).
LANCZOS = {"k": 1, "max_iter": 5, "min_iter": 5, "tol": 1e-8, "seed": 7, "smallest": False}

#: case -> (public call, method, hyper, RunOptions fields beyond COMMON, EngineConfig fields
#: beyond COMMON's).
CASES = {
    "gd_wd": (lambda: ps.run_gd_wd(MODEL, W0, 0.05, 1e-3, jitter=0.01, **COMMON),
              "gd_wd", {"lr": 0.05, "wd": 1e-3}, {"jitter": 0.01},
              {"method": 0, "jitter": 0.01, "reduced": False}),
    "gd_wd_full_space": (lambda: ps.run_gd_wd(MODEL, W0, 0.05, 1e-3, reduced=False, **COMMON),
                         "gd_wd", {"lr": 0.05, "wd": 1e-3}, {"reduced": False},
                         {"method": 0, "jitter": 0.0, "reduced": False}),
    "pgd": (lambda: ps.run_pgd(MODEL, W0, 0.1, jitter=0.02, **COMMON),
            "pgd", {"eta": 0.1}, {"jitter": 0.02},
            {"method": 1, "jitter": 0.02, "reduced": False}),
    "pgd_adaptive": (lambda: ps.run_pgd(MODEL, W0, 0.1, lr=0.05, wd=1e-3, **COMMON),
                     "pgd_adaptive", {"eta": 0.1, "lr": 0.05, "wd": 1e-3}, {},
                     {"method": 2, "jitter": 0.0, "reduced": False}),
    "pgd_quasi_rmsprop": (
        lambda: ps.run_pgd(MODEL, W0, 0.1, scheduler=ps.QuasiRMSprop(0.05, 0.9, 0.5), **COMMON),
        "pgd_quasi_rmsprop", {"eta": 0.1, "c": (1 - 0.9) / 0.05**2},
        {"rms_beta": 0.9, "qr_kappa": 0.5},
        {"method": 4, "jitter": 0.0, "reduced": False, "rms_beta": 0.9, "qr_kappa": 0.5}),
    "scalar_rmsprop": (
        lambda: ps.run_scalar_rmsprop(MODEL, W0, 0.05, 1e-3, beta=0.8, eps=1e-6, **COMMON),
        "scalar_rmsprop", {"lr": 0.05, "wd": 1e-3}, {"rms_beta": 0.8, "rms_eps": 1e-6},
        {"method": 3, "jitter": 0.0, "reduced": True, "rms_beta": 0.8, "rms_eps": 1e-6}),
}


class _Recording:
    """A model's kernel object whose ``run`` calls are kept."""

    def __init__(self, inner, calls: list) -> None:
        self._inner, self._calls = inner, calls

    def run(self, W0, hyper, config, offset):
        self._calls.append((W0.dtype, {k: v.copy() for k, v in hyper.items()}, config, offset))
        return self._inner.run(W0, hyper, config, offset)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _recorded(monkeypatch, call) -> tuple:
    """(the trajectory, the one engine call it made)."""
    calls: list = []
    real = MODEL._core
    monkeypatch.setattr(MODEL, "_core", lambda *a, **kw: _Recording(real(*a, **kw), calls))
    try:
        tr = call()
    finally:
        monkeypatch.undo()
    assert len(calls) == 1
    return tr, calls[0]


@pytest.mark.parametrize("case", CASES)
def test_every_run_function_hands_its_options_to_the_engine(monkeypatch, case):
    public, method, hyper, extra, config = CASES[case]
    tr, (dtype, got_hyper, got_config, offset) = _recorded(monkeypatch, public)
    expected = {"steps": 12, "record_every": 3, "sharpness_every": 4, "theta_every": 6,
                "seed": 7, "rms_beta": 0.99, "rms_eps": 1e-12, "qr_kappa": 0.0, "top_k": 2,
                "lanczos": LANCZOS} | config
    assert got_config == expected
    assert offset == 11 and dtype == np.float64 and tr.eos_tol == 0.1
    assert set(got_hyper) == set(hyper)
    for name, value in hyper.items():
        np.testing.assert_allclose(got_hyper[name], value, rtol=1e-15)
    # the same RunOptions given to the runner directly: the same call, the same bits
    options = RunOptions(**COMMON, **extra)
    direct, (_, _, direct_config, direct_offset) = _recorded(
        monkeypatch, lambda: run_method(MODEL, W0, hyper, method=method, options=options))
    assert direct_config == got_config and direct_offset == offset
    for field in ("w", "loss", "norm2", "eff_lr", "sharpness", "top_eigenvalues", "theta"):
        assert getattr(direct, field).tobytes() == getattr(tr, field).tobytes(), field


def test_run_method_takes_options_or_keywords_and_refuses_what_the_method_ignores():
    hyper = {"lr": 0.05, "wd": 1e-3}
    by_keywords = run_method(MODEL, W0, hyper, 6, method="gd_wd", sharpness_every=2, seed=3)
    by_options = run_method(MODEL, W0, hyper, method="gd_wd",
                            options=RunOptions(steps=6, sharpness_every=2, seed=3))
    assert by_keywords.w.tobytes() == by_options.w.tobytes()
    with pytest.raises(TypeError, match="not both"):
        run_method(MODEL, W0, hyper, 6, method="gd_wd", options=RunOptions(steps=6))
    with pytest.raises(TypeError, match="needs steps"):
        run_method(MODEL, W0, hyper, method="gd_wd")
    with pytest.raises(ValueError, match="'gd_wd' does not read rms_beta"):
        run_method(MODEL, W0, hyper, 6, method="gd_wd", rms_beta=0.5)
    with pytest.raises(ValueError, match="'pgd' does not read replacement, max_loss"):
        run_method(MODEL, W0, {"eta": 0.1}, 6, method="pgd", replacement=True, max_loss=1.0)
    with pytest.raises(ValueError, match="'sgd' is not run by the trajectory engine.*run_sgd"):
        run_method(MODEL, W0, hyper, 6, method="sgd")


def test_run_sgd_hands_its_options_to_the_minibatch_runner(monkeypatch):
    lin = ps.models.LinearRegression.synthetic(d=3, n=6, seed=1)
    w0 = np.ones((2, 3))
    calls = []
    real = lin._core

    class Recording:
        def __init__(self, inner):
            self._inner = inner

        def sgd(self, *args):
            calls.append(args[4:])
            return self._inner.sgd(*args)

    monkeypatch.setattr(lin, "_core", lambda dtype: Recording(real(dtype)))
    res = run_sgd(lin, w0, [0.05, 0.1], 2, 20, wd=1e-3, replacement=True, record_every=4,
                  seed=5, first_trajectory=9, max_loss=1e50)
    options = RunOptions(steps=20, record_every=4, seed=5, first_trajectory=9, replacement=True,
                         max_loss=1e50)
    direct = run_minibatch(lin, w0, {"lr": [0.05, 0.1], "batch": 2, "wd": 1e-3}, method="sgd",
                           options=options)
    # steps, record_every, replacement, seed, first_trajectory, max_loss: as the keywords say
    assert calls == [(20, 4, True, 5, 9, 1e50)] * 2
    assert res.w.tobytes() == direct.w.tobytes() and res.loss.tobytes() == direct.loss.tobytes()
    no_wd = run_minibatch(lin, w0, {"lr": 0.05, "batch": 2}, method="sgd",
                          options=RunOptions(steps=20))
    assert no_wd.w.tobytes() == run_sgd(lin, w0, 0.05, 2, 20).w.tobytes()  # wd optional: 0
    with pytest.raises(ValueError, match="'sgd' does not read jitter"):
        run_minibatch(lin, w0, {"lr": 0.05, "batch": 2}, method="sgd",
                      options=RunOptions(steps=5, jitter=0.1))
    with pytest.raises(ValueError, match="takes the hyperparameters"):
        run_minibatch(lin, w0, {"lr": 0.05}, method="sgd", options=RunOptions(steps=5))
    with pytest.raises(ValueError, match="'gd_wd' is not run by the minibatch engine"):
        run_minibatch(lin, w0, {"lr": 0.05, "wd": 0.0}, method="gd_wd",
                      options=RunOptions(steps=5))


def test_the_table_rows_name_their_engine_and_only_the_trajectory_rows_are_compiled():
    assert METHODS == {n: m for n, m in ALL_METHODS.items() if m.engine == "trajectory"}
    assert ALL_METHODS["sgd"].engine == "minibatch" and ALL_METHODS["sgd"].code is None
    assert "sgd" not in dict(loader.core().METHODS)
    option_fields = {f.name for f in dataclasses.fields(RunOptions)}
    for m in ALL_METHODS.values():
        engine = ENGINES[m.engine]
        assert set(m.hyper) <= set(engine.hyper) and set(m.optional) <= set(m.hyper)
        assert set(m.reads) <= option_fields and (m.code is None) == (m.engine != "trajectory")
        module, function = engine.runner.split(".")
        assert callable(getattr(importlib.import_module(f"pysharp.{module}"), function))
        assert callable(getattr(ps, m.runner))
    # every RunOptions field is read by some engine or row
    assert option_fields == {f for m in ALL_METHODS.values() for f in m.reads}
