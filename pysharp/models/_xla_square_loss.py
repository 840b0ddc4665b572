"""A JAX network on the square loss, run by XLA: :func:`square_loss_from_jax`.

The network is the user's own ``predict(params, x)`` for ONE sample, called by JAX as
written. The model gives what the SGD stability theory and :func:`pysharp.run_sgd` need
(per-sample Jacobians by ``vmap(jacrev)``, chunked over samples) through
:mod:`pysharp._backends._jax_square_loss`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._jax import x64
from .._backends._jax_square_loss import SquareLossKernels, run_sgd
from .._engine.loader import core
from .._engine.memory import available_memory
from .._engine.validation import as_batch, as_float_array, as_positive_int
from ._xla import _leaf_paths

#: Bytes one chunk's per-sample Jacobian (chunk, k, D) may take by default (JAX's
#: intermediates of ``vmap(jacrev)`` take a small multiple of it).
CHUNK_BYTES = 64 * 2 ** 20


class XlaSquareLossModel:
    """A network ``predict(params, x)`` on L = (1/2n) sum_i ||predict(params, x_i) - y_i||^2.

    See :func:`square_loss_from_jax`. Every method takes the flat ``w`` (D,) of
    ``ravel_pytree(params)`` or a batch (B, D), and computes in float64.

    Attributes
    ----------
    X : ndarray, shape (n, ...)
        Training inputs (read-only float64 copy).
    y : ndarray, shape (n,) or (n, k)
        Training targets as given (read-only float64 copy).
    Y : ndarray, shape (n, k)
        The targets with the output axis always present.
    outputs : int
        k, the number of outputs per sample (1 for scalar outputs).
    chunk : int
        Samples per chunk of every pass over the data.
    leaf_paths : list of str
        The leaves of ``params``, in the order of w.
    """

    #: which leaf is the first layer is not known: input_smoothness gives the moments only
    has_first_layer = False
    #: who computes the Jacobians that pysharp.stability reads, and runs SGD: XLA
    jacobians_by = "xla"
    #: the smallest SGD batch, and the words that say why when it is above 1
    sgd_min_batch: tuple[int, str] = (1, "")

    def __init__(self, predict: Callable, params: Any, X, Y, *, chunk: int | None = None):
        import jax  # lazy: JAX is an optional dependency
        from jax.flatten_util import ravel_pytree

        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:
            raise ValueError("params has no arrays")
        self.leaf_paths = _leaf_paths(params)
        for path, leaf in zip(self.leaf_paths, leaves):
            if np.dtype(getattr(leaf, "dtype", np.asarray(leaf).dtype)).kind != "f":
                raise TypeError(f"params leaf {path!r} is not a float array: every leaf of "
                                "params is a parameter")
        X = as_float_array(X, "X", np.float64).copy()
        if X.ndim < 1 or X.shape[0] < 1:
            raise ValueError(f"X must have a leading sample axis (n, ...) with n >= 1, got "
                             f"shape {X.shape}")
        y = as_float_array(Y, "Y", np.float64).copy()
        if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
            raise ValueError(f"Y must have shape ({X.shape[0]},) or ({X.shape[0]}, k) to match "
                             f"X, got {y.shape}")
        X.flags.writeable = y.flags.writeable = False
        self.X, self.y = X, y
        self.Y = y[:, None] if y.ndim == 1 else y
        self.outputs = int(self.Y.shape[1])
        self.predict_fn, self.params = predict, params
        with x64():
            flat, self._unravel = ravel_pytree(jax.tree_util.tree_map(
                lambda a: jax.numpy.asarray(a, dtype=jax.numpy.float64), params))
            out = jax.eval_shape(lambda p, x: predict(p, x), self._unravel(flat),
                                 jax.ShapeDtypeStruct(X.shape[1:], np.float64))
        self._w0 = np.asarray(flat)
        want = "()" if y.ndim == 1 else f"({self.outputs},)"
        if (y.ndim == 1 and out.shape not in ((), (1,))) or \
                (y.ndim == 2 and out.shape != (self.outputs,)):
            raise ValueError(f"predict(params, x) returns shape {out.shape} for one sample x of "
                             f"shape {X.shape[1:]}, but Y of shape {y.shape} needs {want}")
        D, k = self.dim, self.outputs
        if chunk is None:
            budget = CHUNK_BYTES
            room = available_memory()
            if room is not None:
                budget = min(budget, room // 16)
            chunk = max(1, min(self.n, budget // (8 * k * D)))
        self.chunk = min(as_positive_int(chunk, "chunk"), self.n)
        unravel = self._unravel

        def pred(w, x):
            return jax.numpy.reshape(predict(unravel(w), x), (k,))
        self._pred = pred
        self._kernels = SquareLossKernels(pred, self.X, self.Y, D, self.chunk)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return int(self._w0.size)

    @property
    def n(self) -> int:
        """Number of training samples."""
        return int(self.X.shape[0])

    @property
    def input_shape(self) -> tuple:
        """Shape of one input x."""
        return tuple(self.X.shape[1:])

    @property
    def input_dim(self) -> int:
        """Entries of one input x."""
        return int(np.prod(self.input_shape, dtype=np.int64))

    @property
    def scalar_output(self) -> bool:
        """Whether Y was given as (n,): predictions and Jacobians drop the output axis."""
        return self.y.ndim == 1

    def jacobian_bytes(self) -> int:
        """Bytes of the dense per-sample Jacobian (n, k, D) in float64."""
        return self.n * self.outputs * self.dim * 8

    # -- parameters ----------------------------------------------------------------------
    def unravel(self, w) -> Any:
        """The parameter pytree of a flat w (D,), as JAX float64 arrays."""
        with x64():
            return self._unravel(np.asarray(w, dtype=np.float64))

    def initial_point(self) -> np.ndarray:
        """The flat w (D,) of the ``params`` the model was built from, float64."""
        return self._w0.copy()

    def with_data(self, X, Y=None) -> XlaSquareLossModel:
        """The same network on other data (Y defaults to zeros of the same output shape)."""
        X = np.asarray(X)
        if Y is None:
            Y = np.zeros((X.shape[0],) + self.y.shape[1:])
        return XlaSquareLossModel(self.predict_fn, self.params, X, Y, chunk=self.chunk)

    def _points(self, w) -> tuple[np.ndarray, bool]:
        return as_batch(w, self.dim, "w", dtype=np.float64)

    def _out(self, a: np.ndarray, single: bool, axis: int) -> np.ndarray:
        """Drop the output axis (at ``axis`` of one point's array) for scalar outputs, and
        the batch axis for a single point."""
        if self.scalar_output:
            a = np.take(a, 0, axis=axis + 1)
        return a[0] if single else a

    # -- kernels -------------------------------------------------------------------------
    def loss_and_grad(self, w) -> tuple[np.ndarray, np.ndarray]:
        """Loss L(w), shape () or (B,), and gradient, shape of ``w`` (one pass each)."""
        W, single = self._points(w)
        rows = [self._kernels.loss_grad(x) for x in W]
        L = np.array([r[0] for r in rows])
        G = np.array([r[1] for r in rows])
        return (L[0], G[0]) if single else (L, G)

    def loss(self, w) -> np.ndarray:
        """L(w) = (1/2n) sum_i ||predict(params(w), x_i) - y_i||^2, shape () or (B,)."""
        return self.loss_and_grad(w)[0]

    def grad(self, w) -> np.ndarray:
        """grad L(w), shape of ``w``."""
        return self.loss_and_grad(w)[1]

    def jacobians(self, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predictions, per-sample parameter Jacobians and input Jacobians on the training
        inputs (dense: refused with a MemoryError when n k D floats cannot fit).

        Returns
        -------
        f : ndarray, shape (n, k) (or (n,) for scalar outputs), with (B, ...) for a batch
        J : ndarray, shape (n, k, D) (or (n, D))
            J_i = d predict(x_i) / dw.
        gx : ndarray, shape (n, k, *x.shape) (or (n, *x.shape))
            d predict(x_i) / dx.
        """
        W, single = self._points(w)
        out = [self._kernels.jacobians(x) + (self._kernels.input_jacobians(x, self.X),)
               for x in W]
        F, J, GX = (np.stack(c) for c in zip(*out))
        return self._out(F, single, 1), self._out(J, single, 1), self._out(GX, single, 1)

    def predict(self, w) -> np.ndarray:
        """Predictions on the training inputs, (n, k) or (n,) (with (B, ...) for a batch)."""
        W, single = self._points(w)
        F = np.stack([np.concatenate([f for _, _, f, _ in self._kernels.jacobian_chunks(x)])
                      for x in W])
        return self._out(F, single, 1)

    def param_gradients(self, w) -> np.ndarray:
        """Per-sample parameter Jacobians J_i, (n, k, D) or (n, D) for scalar outputs."""
        W, single = self._points(w)
        J = np.stack([self._kernels.jacobians(x)[1] for x in W])
        return self._out(J, single, 1)

    def jacobian_rows(self, w) -> np.ndarray:
        """The per-sample Jacobians as rows: (n k, D) for one point (sample-major: rows
        i k .. i k + k - 1 are J_i), (B, n k, D) for a batch. Dense: refused in words when
        they cannot fit."""
        W, single = self._points(w)
        A = np.stack([self._kernels.jacobians(x)[1].reshape(self.n * self.outputs, self.dim)
                      for x in W])
        return A[0] if single else A

    def _run_sgd(self, W0: np.ndarray, lr: np.ndarray, batch: np.ndarray, wd: np.ndarray,
                 steps: int, record_every: int, replacement: bool, seed: int,
                 first_trajectory: int, max_loss: float) -> dict:
        """pysharp.sgd's engine for this model (validated arguments): SGD in XLA over the
        batches the compiled core draws for each trajectory (pysharp.sgd.sgd_batches)."""
        T = W0.shape[0]
        batches = np.zeros((T, steps, int(batch.max())), dtype=np.int32)
        for lane in range(T):
            batches[lane, :, : batch[lane]] = core().sgd_batches(
                self.n, int(batch[lane]), replacement, seed, first_trajectory + lane, steps)
        out = run_sgd(self._pred, self.X, self.Y, W0, lr, wd, batch, batches, steps,
                      record_every, max_loss, self.chunk)
        out["diverged"] = out["diverged_step"] >= 0
        return out

    def input_gradients(self, w, X=None) -> np.ndarray:
        """d predict(x_i) / dx on X (default: the training inputs): (N, k, *x.shape), or
        (N, *x.shape) for scalar outputs."""
        W, single = self._points(w)
        X = self.X if X is None else np.asarray(X, dtype=np.float64)
        GX = np.stack([self._kernels.input_jacobians(x, X) for x in W])
        return self._out(GX, single, 1)

    def gauss_newton_hvp(self, w, v) -> np.ndarray:
        """G v = (1/n) sum_i J_i^T J_i v (the Hessian at interpolation), chunked: w (D,),
        v (D,) or (m, D)."""
        W, _ = self._points(w)
        if W.shape[0] != 1:
            raise ValueError("gauss_newton_hvp takes a single point w (D,)")
        V = np.asarray(v, dtype=np.float64)
        out = self._kernels.gauss_newton(W[0], np.atleast_2d(V))
        return out[0] if V.ndim == 1 else out

    def stability_products(self, w, V) -> tuple[np.ndarray, np.ndarray]:
        """(mean_i H_i V, mean_i H_i^2 V) for V (m, D), H_i = J_i^T J_i: one chunked pass."""
        W, _ = self._points(w)
        return self._kernels.products(W[0], np.atleast_2d(np.asarray(V, dtype=np.float64)))

    def jacobian_moment(self, w, k: int = 1) -> float:
        """(1/n) sum_i ||J_i||_{2k}^{2k} (entrywise 2k-norm): one chunked pass."""
        W, _ = self._points(w)
        return self._kernels.jacobian_moment(W[0], as_positive_int(k, "k"))

    def input_moment(self, w, k: int = 1) -> float:
        """(1/n) sum_i ||d predict(x_i) / dx||_{2k}^{2k} (entrywise): one chunked pass."""
        W, _ = self._points(w)
        return self._kernels.input_moment(W[0], as_positive_int(k, "k"))

    def spec(self) -> dict:
        return {"model": "square_loss_from_jax",
                "predict": getattr(self.predict_fn, "__qualname__", "predict"),
                "n": self.n, "outputs": self.outputs, "dim": self.dim}

    def __repr__(self) -> str:
        name = getattr(self.predict_fn, "__qualname__", "predict")
        return (f"XlaSquareLossModel({name}: n={self.n}, x={self.input_shape}, "
                f"k={self.outputs}, dim={self.dim}, chunk={self.chunk})")


def square_loss_from_jax(predict: Callable, params, X, Y, *, compile: bool = False,
                         chunk: int | None = None) -> XlaSquareLossModel:
    """A square-loss model from a network written in JAX, for SGD and its linear stability.

    L(w) = (1/2n) sum_i ||predict(params, x_i) - y_i||^2 over the n training samples,
    with w the flat vector of ``jax.flatten_util.ravel_pytree(params)`` (D values).
    :func:`pysharp.run_sgd` trains it (in XLA, over the compiled core's batches) and
    every function of :mod:`pysharp.stability` takes it, with k > 1 outputs: the
    per-sample Hessian at an interpolating minimum is then H_i = J_i^T J_i, J_i (k, D)
    the Jacobian of sample i.

    Parameters
    ----------
    predict : callable
        ``predict(params, x) -> (k,) or scalar`` for ONE sample x of shape ``X.shape[1:]``
        (pure JAX: vmapped and differentiated by pysharp).
    params : pytree
        Dicts, lists and tuples of float arrays (a Flax or Equinox parameter tree, or
        plain JAX's); ``model.unravel(w)`` gives the pytree back, ``model.initial_point()``
        the flat params.
    X : array_like, shape (n, ...)
        Inputs (images may keep their shape; the sample axis first).
    Y : array_like, shape (n,) or (n, k)
        Targets: (n,) for a scalar prediction, (n, k) for k outputs (e.g. one-hot labels
        of a k-class network).
    compile : bool
        Only False: the network runs in XLA. True (tracing to the compiled core) is not
        implemented for square-loss networks and raises NotImplementedError.
    chunk : int, optional
        Samples per chunk of every pass over the data (default: as many as keep one
        chunk's Jacobian, chunk x k x D floats, within 64 MiB). Results do not depend on it
        beyond rounding.

    Returns
    -------
    XlaSquareLossModel

    Notes
    -----
    What scales with n k D: ``per_sample_gradients``, ``second_moment_operator``,
    ``critical_lr``, ``stability_conditions``, ``moment_growth`` and ``lyapunov_exponent``
    need the dense Jacobian (n k, D) and refuse in words (MemoryError) when it does not
    fit; ``sharpness_nonuniformity(method="lanczos")``, ``input_smoothness``,
    ``gradient_moment_ratio`` and ``run_sgd`` run over chunks of samples at any n. For
    the small scalar models of the papers' toys the compiled ``LinearRegression`` and
    ``TwoLayerNet`` are much faster per step: use those where they fit.

    Examples
    --------
    >>> def predict(p, x):  # doctest: +SKIP
    ...     return p["W2"] @ jnp.tanh(p["W1"] @ x + p["b1"])
    >>> model = ps.models.square_loss_from_jax(predict, params, X, Y_onehot)  # doctest: +SKIP
    >>> stability.sharpness_nonuniformity(model, model.initial_point())  # doctest: +SKIP
    """
    if compile:
        raise NotImplementedError(
            "square_loss_from_jax(..., compile=True) is not implemented: the network runs in "
            "XLA (compile=False, the default). For a small scalar network the compiled core's "
            "LinearRegression and TwoLayerNet, or a square-loss model written as a C++ header "
            "(pysharp.models.load_model), run in the compiled core")
    return XlaSquareLossModel(predict, params, X, Y, chunk=chunk)


__all__ = ["square_loss_from_jax", "XlaSquareLossModel"]
