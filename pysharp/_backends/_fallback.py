"""Fallback cores with the compiled core's interface: Numba ports and NumPy oracles.

A model's ``_core(dtype, backend)`` returns one of these instead of a
``pysharp._core`` object; the Python layer above (validation, power-of-two
rescaling, result shapes) is the same for every backend. Both compute in
float64. The NumPy oracles cast their results to the requested dtype; the
Numba port, a stand-in for the core (which computes float32 in float32),
refuses float32 rather than compute it in float64 unannounced.
"""

from __future__ import annotations

import numpy as np

from .._engine import Method
from .._engine.methods import METHODS
from .._engine.records import run_result_names
from ._errors import BackendUnavailable

#: The Numba port's scope: a frozen subset of the compiled core, kept so that an install
#: without a C++ compiler still runs the paper's models. It is extended only by porting
#: C++ line for line; everything outside it is refused by name (BackendUnavailable). What it
#: runs is read where it is declared, never listed here: the methods are the method table's
#: rows with ``numba`` set (``METHODS``), the models the classes whose ``_backends`` list
#: "numba", each giving ``_numba_params`` (the dispatch refuses the others); NumbaCore refuses
#: other dtypes and in-run top-k eigenvalues (tests/backends/test_backends.py and
#: tests/engine/test_methods.py check both).
NUMBA_SCOPE = {
    "kernels": ("loss_grad", "hvp", "third", "hessian", "lanczos", "run"),
    "dtypes": ("float64",),
}


def _u8(ok) -> np.ndarray:
    return np.asarray(ok, dtype=np.uint8)


class _Cast:
    """Casts float64 results to the caller's dtype."""

    def __init__(self, dtype) -> None:
        self.dtype = np.dtype(dtype)

    def _out(self, *arrays):
        return tuple(a.astype(self.dtype, copy=False) if a.dtype == np.float64 else a
                     for a in arrays)


class NumbaCore(_Cast):
    """The C++ kernels and engine, ported to Numba (``_numba_kernels``)."""

    def __init__(self, params: tuple, dtype, reference=None) -> None:
        super().__init__(dtype)
        if self.dtype.name not in NUMBA_SCOPE["dtypes"]:
            raise BackendUnavailable(
                f"the numba backend computes in float64 only, and {self.dtype} was asked "
                "for (the compiled core computes float32 in float32); pass float64 arrays "
                "(or dtype=np.float64) or use backend='cpp' (pip install . builds it)")
        from . import _numba_kernels as nk  # lazy: numba is optional and slow to import

        self._nk = nk
        self._p = params
        self._reference = reference  # for test_loss, a vectorised NumPy expression

    @staticmethod
    def _f64(*arrays):
        return tuple(np.ascontiguousarray(a, np.float64) for a in arrays)

    def loss_grad(self, W):
        (W,) = self._f64(W)
        return self._out(*self._nk.batch_loss_grad(self._p, W))

    def hvp(self, W, V):
        return self._out(*self._nk.batch_directional(self._p, *self._f64(W, V), 1))

    def third(self, W, V):
        return self._out(*self._nk.batch_directional(self._p, *self._f64(W, V), 2))

    def hessian(self, W):
        (W,) = self._f64(W)
        return self._out(*self._nk.batch_hessian(self._p, W))

    def lanczos(self, W, options: dict, start=None):
        """As the compiled core's: ``options`` is ``LanczosOptions.to_core()``."""
        (W,) = self._f64(W)
        o = options
        S = np.zeros_like(W) if start is None else self._f64(start)[0]
        return self._out(*self._nk.batch_lanczos(self._p, W, o["k"], o["max_iter"],
                                                 o["min_iter"], o["tol"], o["seed"], S,
                                                 start is not None, bool(o["smallest"])))

    def run(self, W0, hyper: dict, config: dict, offset: int = 0):
        """As the compiled core's: ``hyper`` {name: (B,)}, ``config`` ``EngineConfig.to_core()``."""
        c, lz = config, config["lanczos"]
        spec = METHODS[Method(c["method"]).name.lower()]
        (W0,) = self._f64(W0)
        zero = np.zeros(W0.shape[0])
        rate, lr, wd = self._f64(hyper["eta"] if spec.on_sphere else hyper["lr"],
                                 hyper.get("lr", zero), hyper.get("wd", zero))
        missing = (f"port of {spec.label} (method {spec.name!r})" if not spec.numba else
                   "in-run top-k eigenvalues (top_k)" if c["top_k"] else None)
        if missing:
            raise BackendUnavailable(f"the numba backend has no {missing}; use backend='cpp'")
        out = self._nk.run(self._p, W0, rate, lr, wd, c["method"], c["steps"], c["record_every"],
                           c["sharpness_every"], c["theta_every"], c["jitter"], c["seed"],
                           offset, c["rms_beta"], c["rms_eps"], lz["max_iter"],
                           lz["min_iter"], lz["tol"])
        # the port's models have one parameter group, and it records no top-k eigenvalues
        return dict(zip(run_result_names(groups=1, top_k=0), self._out(*out), strict=True))

    def test_loss(self, W, rows, cols, values, value_mean, value_std):
        return _reference_test_loss(self._reference, W, rows, cols, values, self.dtype)


class NumpyCore(_Cast):
    """The oracles of ``pysharp.reference``: kernels only, for checking, not speed."""

    def __init__(self, reference, dim: int, dtype) -> None:
        super().__init__(dtype)
        self._ref = reference
        self._dim = dim

    def _checked(self, *arrays):
        """ok per row: every output of the row finite (the reference has no floor)."""
        ok = np.ones(arrays[0].shape[0], dtype=bool)
        for a in arrays:
            ok &= np.all(np.isfinite(a.reshape(a.shape[0], -1)), axis=1)
        return _u8(ok)

    def loss_grad(self, W):
        W = np.asarray(W, np.float64)
        with np.errstate(all="ignore"):
            loss, G = self._ref.loss(W), self._ref.grad(W)
        return self._out(loss, G) + (self._checked(loss[:, None], G),)

    def _directional(self, kernel, W, V):
        with np.errstate(all="ignore"):
            out = getattr(self._ref, kernel)(np.asarray(W, np.float64), np.asarray(V, np.float64))
        return self._out(out) + (self._checked(out),)

    def hvp(self, W, V):
        return self._directional("hvp", W, V)

    def third(self, W, V):
        return self._directional("third", W, V)

    def hessian(self, W):
        W = np.asarray(W, np.float64)
        B, D = W.shape
        eye = np.eye(D)
        with np.errstate(all="ignore"):
            H = np.stack([self._ref.hvp(np.repeat(W[b:b + 1], D, 0), eye).T for b in range(B)])
        return self._out(H) + (self._checked(H),)

    def test_loss(self, W, rows, cols, values, value_mean, value_std):
        return _reference_test_loss(self._ref, W, rows, cols, values, self.dtype)


def _reference_test_loss(ref, W, rows, cols, values, dtype):
    with np.errstate(all="ignore"):
        loss = ref.test_loss(np.asarray(W, np.float64), rows, cols, np.asarray(values, np.float64))
    return loss.astype(dtype), _u8(np.isfinite(loss))
