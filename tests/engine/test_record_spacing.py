"""Between records the engine sums ||w||^2 and ||grad||^2 in another order (two partial sums,
engine/trajectory.hpp's norms_unordered) where their values only decide (the safe range,
finiteness): plain GD+WD reads them at records only. So the spacing of the records must
never change a trajectory's bits, for every method, at every step both runs record."""

from __future__ import annotations

import numpy as np
import pytest

import pysharp as ps

# D >= 16 takes the split sums between records; Toy3D (D 3) the one loop
MODELS = {
    "bn_mc D24": ps.BNMatrixCompletion.synthetic(size=6, true_rank=1, rank=2, n_obs=20, seed=1),
    "bn_linreg d40 direct": ps.BNLinearRegression.synthetic(d=40, n=20, seed=0),
    "toy3d": ps.Toy3D(c=10.0),
}
RUNS = {
    "gd_wd": lambda m, W0, **kw: ps.run_gd_wd(m, W0, [0.1, 0.6, 1.2], 1e-2, **kw),
    "pgd": lambda m, W0, **kw: ps.run_pgd(m, W0, [0.05, 0.1, 0.3], **kw),
    "scalar_rmsprop": lambda m, W0, **kw: ps.run_scalar_rmsprop(m, W0, 0.01, 1e-3, **kw),
}


@pytest.mark.parametrize("method", sorted(RUNS))
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("real", [np.float64, np.float32])
def test_the_record_spacing_never_changes_a_trajectorys_bits(name, method, real):
    model, steps = MODELS[name], 60
    W0 = np.stack([model.random_point(seed=s, norm=3.0) for s in range(3)]).astype(real)
    kw = dict(steps=steps, sharpness_every=0)
    if isinstance(model, ps.BNLinearRegression) and method == "gd_wd":
        kw["reduced"] = False  # the generic engine, not the singular-basis one
    every = RUNS[method](model, W0, record_every=1, **kw)
    sparse = RUNS[method](model, W0, record_every=20, **kw)
    assert not np.any(every.diverged)
    np.testing.assert_array_equal(sparse.w, every.w)
    for field in ("loss", "norm2", "grad_norm"):
        np.testing.assert_array_equal(getattr(sparse, field), getattr(every, field)[::20],
                                      err_msg=field)
