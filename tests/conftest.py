"""Shared fixtures: small instances of every model, each with its NumPy oracle.

Everything here is cheap (the largest model has D = 40), so the whole suite
runs in seconds. Models are built once per session; tests must not mutate them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import pytest

from pysharp.models import BNLinearRegression, BNMatrixCompletion, Toy3D
from pysharp.reference import (
    BNLinearRegressionReference,
    BNMatrixCompletionReference,
    Toy3DReference,
)

DTYPES = (np.float64, np.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, its oracle, and a typical parameter norm for random points."""

    name: str
    model: Any
    ref: Any
    norm: float = 2.5

    @property
    def dim(self) -> int:
        return self.model.dim

    def points(self, batch: int | None = None, *, seed: int = 0, dtype=np.float64,
               norm: float | None = None) -> np.ndarray:
        """Gaussian points of norm ``norm`` (default: a non-unit one), (D,) or (batch, D).

        Drawn in float64, then cast, so float32 and float64 tests see the same points.
        """
        rng = np.random.default_rng(seed)
        n = 1 if batch is None else batch
        w = rng.standard_normal((n, self.dim))
        w *= (self.norm if norm is None else norm) / np.linalg.norm(w, axis=1, keepdims=True)
        w = w.astype(dtype)
        return w[0] if batch is None else w


# -- builders (cached: one model object per session) ---------------------------------
def _linreg(d: int, n: int) -> Case:
    model = BNLinearRegression.synthetic(d=d, n=n, seed=0)
    return Case(f"bn_linreg_d{d}_n{n}", model, BNLinearRegressionReference(model.X, model.y))


def _mc() -> Case:
    model = BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)
    ref = BNMatrixCompletionReference(model.rows, model.cols, model.values, model.shape,
                                      model.rank)
    return Case("bn_matrix_completion", model, ref)


def _toy() -> Case:
    return Case("toy3d", Toy3D(c=10.0), Toy3DReference(10.0))


BUILDERS: dict[str, Callable[[], Case]] = {
    "bn_linreg_small": lambda: _linreg(12, 8),
    "bn_linreg_paper": lambda: _linreg(40, 20),
    "bn_mc": _mc,
    "toy3d": _toy,
}
_CACHE: dict[str, Case] = {}


def get_case(key: str) -> Case:
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[key]()
    return _CACHE[key]


# -- fixtures --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def linreg_small() -> Case:
    """BNLinearRegression.synthetic(d=12, n=8, seed=0) with its oracle."""
    return get_case("bn_linreg_small")


@pytest.fixture(scope="session")
def linreg_paper() -> Case:
    """The paper's setting d = 40, n = 20 with its oracle."""
    return get_case("bn_linreg_paper")


@pytest.fixture(scope="session")
def mc_case() -> Case:
    """BNMatrixCompletion.synthetic(size=6, true_rank=2, rank=3, n_obs=18, seed=0)."""
    return get_case("bn_mc")


@pytest.fixture(scope="session")
def toy_case() -> Case:
    """Toy3D(c=10.0) with its oracle."""
    return get_case("toy3d")


@pytest.fixture(scope="session", params=list(BUILDERS))
def case(request) -> Case:
    """Every model, in turn."""
    return get_case(request.param)


@pytest.fixture(scope="session", params=["bn_linreg_small", "bn_linreg_paper"])
def linreg_case(request) -> Case:
    """Both BN linear regression instances."""
    return get_case(request.param)


@pytest.fixture(params=DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    return np.dtype(request.param)


# -- numerical helpers -----------------------------------------------------------------
def rel_err(a, b) -> float:
    """max |a - b| / max |b| (max-abs normalisation, so zero entries of b are fine)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = np.max(np.abs(b))
    diff = np.max(np.abs(a - b))
    if scale == 0:
        return float(diff)
    return float(diff / scale)


def tol(dtype, f64: float = 1e-12, f32: float = 1e-4) -> float:
    return f64 if np.dtype(dtype) == np.float64 else f32
