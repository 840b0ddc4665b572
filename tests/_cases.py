"""What the tests share: small instances of every model with their NumPy oracles, and the
numerical and file helpers. Test modules import from here (``from _cases import get_case``);
``conftest.py`` holds only pytest's fixtures and hooks, built on these.

"Every model" means every entry of ``pysharp.models.REGISTRY``, built small by the
entry's own factory (``SMALL`` holds the sizes; a model registered without an entry
there is built with its factory's defaults, so it is covered all the same). Models are built
once per session (:func:`get_case`); tests must not mutate them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pysharp.models import (
    REGISTRY,
    BNLinearRegression,
    LinearRegression,
    ScaleInvariantModel,
    TwoLayerNet,
    include_dir,
    load_model,
)
from pysharp.reference import BNLinearRegressionReference

DTYPES = (np.float64, np.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    """A model, its oracle, and a typical parameter norm for random points."""

    name: str
    model: Any
    ref: Any  # the NumPy oracle (pysharp.reference), None for a model without one
    norm: float = 2.5

    @property
    def scale_invariant(self) -> bool:
        return isinstance(self.model, ScaleInvariantModel)

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
#: Factory parameters of a small instance of each registered model (D <= 20).
SMALL: dict[str, dict[str, Any]] = {
    "bn_linear_regression": dict(d=12, n=8, seed=0),
    "bn_matrix_completion": dict(size=6, true_rank=2, rank=3, n_obs=18, seed=0),
    "bn_two_layer_net": dict(n=8, d=4, width=3, teacher_width=3, seed=0),
    "linear_regression": dict(d=5, n=8, seed=0),
    "two_layer_net": dict(d=3, m=4, n=6, seed=0),
    "toy3d": dict(c=10.0),
}


def _loaded_bn_linreg() -> Case:
    """The run-time door: BN linear regression's own header compiled by load_model (the
    small instance's data), checked against the built-in's oracle."""
    builtin = get_case("bn_linear_regression").model
    Xc = builtin._Xc
    model = load_model(include_dir() / "pysharp" / "models" / "bn_linear_regression.hpp",
                       Xc=Xc, u=builtin._u, scale=builtin._scale, xc_fro2=float(np.sum(Xc * Xc)))
    return Case("loaded", model, BNLinearRegressionReference(builtin.X, builtin.y))


def _loaded_two_layer_net() -> Case:
    """The run-time door of square-loss models: the built-in TwoLayerNet's own header
    compiled by load_model with the small instance's data."""
    builtin = get_case("two_layer_net").model
    model = load_model(include_dir() / "pysharp" / "models" / "square_loss.hpp",
                       model_name="TwoLayerNet", X=builtin.X, y=builtin.y, m=builtin.width,
                       act=0, inv_sqrt_m=1 / np.sqrt(builtin.width))
    return Case("loaded_square_loss", model, None)


def _xla_bn_linreg() -> Case:
    """The untraced JAX door: BN linear regression written in JAX as a loss of a parameter
    dict, run by XLA, checked against the built-in's oracle (skipped without JAX)."""
    jnp = pytest.importorskip("jax.numpy")
    from pysharp.models._xla import from_jax

    builtin = get_case("bn_linear_regression").model
    d = builtin.X.shape[1]

    def bn_linreg(p, X, y):
        z = X @ jnp.concatenate([p["head"], p["tail"]])
        pred = y.std() * (z - z.mean()) / z.std() + y.mean()
        return jnp.mean((pred - y) ** 2)

    model = from_jax(bn_linreg, {"head": np.ones(d // 2), "tail": np.ones(d - d // 2)},
                     X=builtin.X, y=builtin.y)
    return Case("from_jax", model, BNLinearRegressionReference(builtin.X, builtin.y))


def _registered(name: str) -> Case:
    """The registered model ``name``, built small by its entry's factory, with its oracle."""
    if name == "from_jax":
        return _xla_bn_linreg()
    if name == "loaded":
        return _loaded_bn_linreg()
    if name == "loaded_square_loss":
        return _loaded_two_layer_net()
    model = REGISTRY[name].factory(**SMALL.get(name, {}))
    ref = model._reference() if isinstance(model, ScaleInvariantModel) else None
    return Case(name, model, ref)


def _linreg(d: int, n: int) -> Case:
    model = BNLinearRegression.synthetic(d=d, n=n, seed=0)
    return Case(f"bn_linreg_d{d}_n{n}", model, BNLinearRegressionReference(model.X, model.y))


#: Every registered model (a model registered later is covered without editing this file).
REGISTERED: list[str] = list(REGISTRY)
#: The registered scale-invariant models with every backend (``case``): the loaded door
#: runs on the compiled core alone (numpy and numba refused) and the JAX door in XLA alone,
#: so their place is ``any_case`` (tests/test_every_tool.py), tests/models/test_loaded.py
#: and tests/backends/test_jax_backend.py.
SCALE_INVARIANT: list[str] = [n for n in REGISTERED if n not in ("loaded", "from_jax")
                              and issubclass(REGISTRY[n].cls, ScaleInvariantModel)]

BUILDERS: dict[str, Callable[[], Case]] = {
    **{name: (lambda name=name: _registered(name)) for name in REGISTERED},
    "bn_linreg_paper": lambda: _linreg(40, 20),
}
#: Older names of the registry's instances (the same cached Case).
ALIASES = {"bn_linreg_small": "bn_linear_regression", "bn_mc": "bn_matrix_completion"}
_CACHE: dict[str, Case] = {}


def get_case(key: str) -> Case:
    key = ALIASES.get(key, key)
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[key]()
    return _CACHE[key]


# -- square-loss models (SGD, linear stability) -----------------------------------------
def square_linreg(n: int = 6, d: int = 3, seed: int = 0, realizable: bool = True):
    """Linear regression on n Gaussian samples in d dimensions; realizable: y = X w* exactly
    (an interpolating minimum exists), else y is noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) if realizable else rng.standard_normal(n)
    return LinearRegression(X, y)


def square_net(n: int = 8, d: int = 3, m: int = 5, seed: int = 0):
    """The two-layer net (width m) on n Gaussian samples, y = sin(x_0)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return TwoLayerNet(d, m, X=X, y=np.sin(X[:, 0]))


def conv_bn_loss(p, X, y):
    """A small CNN as JAX code: one 'SAME' convolution (kernels p["c"]), BatchNorm over the
    batch and the pixels, ReLU, average pooling, a linear head p["fc"], cross-entropy on the
    integer labels y. The XLA engine runs a batch of such rows one row at a time on the CPU."""
    import jax
    import jax.numpy as jnp

    z = jax.lax.conv_general_dilated(X, p["c"], (1, 1), "SAME")
    z = (z - z.mean((0, 2, 3), keepdims=True)) / jnp.sqrt(z.var((0, 2, 3), keepdims=True) + 1e-12)
    logits = jax.nn.relu(z).mean((2, 3)) @ p["fc"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(X.shape[0]), y])


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


#: The repository the tests sit in, and its example models' headers and reference modules.
REPO = Path(__file__).resolve().parents[1]
EXAMPLE_MODELS = REPO / "examples" / "models"


def bench_module(name: str):
    """bench/<name>.py imported as ``bench.<name>``; the calling test module is skipped where
    bench/ is not next to the tests. The repository root is on sys.path for this import only:
    left there, it would shadow the installed pysharp (no compiled core in the source tree)
    in every process later tests start (dask workers, subprocesses)."""
    if not (REPO / "bench" / f"{name}.py").is_file():
        pytest.skip("the bench/ folder is not part of this tree", allow_module_level=True)
    sys.path.insert(0, str(REPO))
    try:
        return importlib.import_module(f"bench.{name}")
    finally:
        sys.path.remove(str(REPO))


def example_module(name: str):
    """examples/models/<name>.py, imported (its reference losses and synthetic data);
    the calling test is skipped where examples/ is not next to the tests."""
    path = EXAMPLE_MODELS / f"{name}.py"
    if not path.is_file():
        pytest.skip("examples/ not next to the tests")
    spec = importlib.util.spec_from_file_location(f"{name}_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
