"""The sweep asks the method table, not method names: SGD is swept as a row of it.

The sources of pysharp/sweeps are read with ``ast``: no comparison with a method's name is
left. An SGD sweep still computes what it did: each point against an independent NumPy SGD
over the engine's own batches (``sgd_batches``, keyed by the point's flat index).
"""

from __future__ import annotations

import ast
import importlib
import itertools
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine.methods import ALL_METHODS, ENGINES
from pysharp.sgd import sgd_batches
from pysharp.sweeps._compute import CHUNKS, METHOD_DIMS

xr = pytest.importorskip("xarray")

SWEEPS = Path(ps.__file__).parent / "sweeps"


def _name_tests(source: str) -> list[str]:
    """The comparisons in ``source`` of anything with a method's name (``m == "sgd"``,
    ``m in ("gd_wd", ...)``)."""
    names = set(ALL_METHODS)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [c.value for o in operands for c in ast.walk(o) if isinstance(c, ast.Constant)]
            if names & {v for v in values if isinstance(v, str)}:
                found.append(ast.unparse(node))
    return found


def test_the_sweep_code_tests_no_method_name():
    assert _name_tests('if method == "sgd" or x in ("pgd", 1): pass') == [
        "method == 'sgd'", "x in ('pgd', 1)"]  # the scan sees both forms
    for path in sorted(SWEEPS.glob("*.py")):
        assert _name_tests(path.read_text()) == [], path.name


def test_each_engine_is_swept_by_its_runner_with_the_rows_grid():
    for name, chunks in CHUNKS.items():
        module, function = ENGINES[name].runner.split(".")
        assert chunks.run is getattr(importlib.import_module(f"pysharp.{module}"), function)
    assert METHOD_DIMS == {"gd_wd": ("lr", "wd", "seed", "init_norm"),
                           "pgd": ("lr", "wd", "seed", "init_norm"),
                           "scalar_rmsprop": ("lr", "wd", "seed", "init_norm"),
                           "sgd": ("lr", "batch", "wd", "seed", "init_norm")}


@pytest.mark.parametrize("replacement", [False, True])
def test_an_sgd_sweep_is_numpy_sgd_on_the_engines_batches(replacement):
    spec = {"name": "linear_regression", "d": 3, "n": 6, "seed": 4}
    lrs, batches, wds, seeds, norms = [0.05, 0.3], [1, 4], [0.0, 1e-2], [0, 2], [1.0, 2.0]
    steps, every = 30, 7
    ds = ps.sweep(spec, method="sgd", lr=lrs, batch=batches, wd=wds, seeds=seeds,
                  init_norm=norms, steps=steps, record_every=every, replacement=replacement,
                  chunk_size=5, progress=False)
    assert ds.loss.dims == ("lr", "batch", "wd", "seed", "init_norm", "step")
    assert list(ds.step.values) == [0, 7, 14, 21, 28]
    model = ps.models.LinearRegression.synthetic(d=3, n=6, seed=4)
    X, y = model.X, model.y
    points = itertools.product(lrs, batches, wds, seeds, norms)
    for k, (lr, B, wd, seed, norm) in enumerate(points):
        direction = model.random_point(seed=seed)
        w = direction * norm / np.linalg.norm(direction)
        losses = []
        for t, I in enumerate(sgd_batches(6, B, steps, replacement=replacement, seed=0,
                                          trajectory=k)):
            if t % every == 0:
                losses.append(0.5 * np.mean((X @ w - y) ** 2))
            w = (1 - lr * wd) * w - lr * X[I].T @ (X[I] @ w - y[I]) / B
        p = ds.sel(lr=lr, batch=B, wd=wd, seed=seed, init_norm=norm)
        assert not bool(p.diverged)
        np.testing.assert_allclose(p.loss.values, losses, rtol=1e-11, atol=0)
        assert float(p.final_loss) == float(p.loss[-1])
