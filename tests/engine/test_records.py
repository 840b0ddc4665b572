"""The record table (pysharp._engine.records.RECORDS): the compiled core was built from its rows
(engine/records.hpp, which tools/gen_methods.py writes from them), and a run returns exactly the
arrays they describe."""

from __future__ import annotations

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import EngineConfig, LanczosOptions, Method, loader
from pysharp._engine.records import RECORDS, run_outputs, run_result_names


def test_the_core_was_compiled_from_the_table():
    # a stale engine/records.hpp or a stale build differs here, row by row
    built = loader.core().RECORDS
    assert len(built) == len(RECORDS)
    for got, r in zip(built, RECORDS):
        assert got == (r.name, r.field, r.dtype, r.every, r.item, r.when)


@pytest.mark.parametrize("real", [np.float64, np.float32])
@pytest.mark.parametrize("kw", [{}, {"sharpness_every": 10, "theta_every": 25, "top_k": 2},
                                {"sharpness_every": 0, "top_k": 3}])
@pytest.mark.parametrize("model, groups", [(ps.Toy3D(c=10.0), 1),
                                           (ps.BNTwoLayerNet.synthetic(n=6, d=3, width=2,
                                                                       seed=0), 2)])
def test_run_returns_the_arrays_of_the_table_key_by_key(model, groups, kw, real):
    B, steps, every = 3, 50, 5
    W0 = np.stack([model.random_point(seed=s) for s in range(B)])
    lz = LanczosOptions.for_dim(model.dim, 1, None, tol=1e-10, seed=0, name="m")
    cfg = EngineConfig(Method.GD_WD, steps=steps, record_every=every, lanczos=lz, **kw)
    got = model._core(np.dtype(real)).run(W0, {"lr": np.full(B, 0.1), "wd": np.full(B, 1e-3)},
                                          cfg.to_core())
    want = run_outputs(B, model.dim, groups, steps=steps, record_every=every,
                       sharpness_every=cfg.sharpness_every, theta_every=cfg.theta_every,
                       top_k=cfg.top_k, real=real)
    assert list(got) == run_result_names(groups, cfg.top_k)
    for name, a in got.items():
        assert (a.shape, a.dtype) == want[name], name
