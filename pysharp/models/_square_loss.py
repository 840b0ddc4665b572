"""Square-loss models with per-sample Jacobians, for SGD and its linear stability.

L(W) = (1/2n) sum_i (f(x_i; W) - y_i)^2 (docs/theory.rst, section "SGD
linear stability"). Unlike the scale-invariant models these are not defined up to
scale: any finite W is a valid point, W = 0 included.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from .._engine.loader import core
from .._engine.validation import (
    as_batch,
    as_float_array,
    as_positive_int,
    as_real,
    keeps_array_type,
)
from ._registry import ModelEntry, register


def _data(X, y, n_min: int = 1) -> tuple[np.ndarray, np.ndarray]:
    X = as_float_array(X, "X", np.float64).copy()
    if X.ndim != 2 or X.shape[0] < n_min or X.shape[1] < 1:
        raise ValueError(f"X must be 2-D (n, d) with n >= {n_min} and d >= 1, got shape {X.shape}")
    if y is None:
        y = np.zeros(X.shape[0])
    y = as_float_array(y, "y", np.float64).copy()
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},) to match X, got {y.shape}")
    X.flags.writeable = y.flags.writeable = False
    return X, y


class SquareLossModel(abc.ABC):
    """A model f(x; W) trained on the square loss L = (1/2n) sum_i (f(x_i; W) - y_i)^2.

    Every method takes ``w`` of shape (D,) or (B, D), float64 or float32
    (integers become float64), and returns matching leading shapes. Besides
    the exact loss, gradient, HVP (forward-mode jets) and dense Hessian it
    gives the per-sample Jacobians that the SGD stability theory is built on:
    a_i = grad_W f(x_i; W) (``param_gradients``) and grad_x f(x_i; W)
    (``input_gradients``).

    Attributes
    ----------
    X : ndarray, shape (n, d)
        Training inputs (read-only copy).
    y : ndarray, shape (n,)
        Training targets (read-only copy).
    """

    #: whether the model's parameters start with a first layer W1 multiplying x
    has_first_layer = True
    #: outputs per sample (k); pysharp.stability reads it with jacobian_rows
    outputs = 1
    #: who computes the Jacobians that pysharp.stability reads, and runs SGD: the compiled core
    jacobians_by = "core"
    #: the smallest SGD batch, and the words that say why when it is above 1
    sgd_min_batch: tuple[int, str] = (1, "")

    def __init__(self, X, y) -> None:
        self.X, self.y = _data(X, y)
        self._cores: dict[np.dtype, Any] = {}

    # -- what subclasses provide ------------------------------------------------
    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Number of parameters D."""

    @abc.abstractmethod
    def _make_core(self, suffix: str) -> Any:
        """The ``pysharp._core`` object for dtype suffix '_f64' or '_f32'."""

    @abc.abstractmethod
    def with_data(self, X, y=None) -> SquareLossModel:
        """The same architecture on other data (y defaults to zeros)."""

    @abc.abstractmethod
    def first_layer(self, w) -> tuple[np.ndarray, slice]:
        """W1 (..., m, d) of the first layer and the slice of its entries in w."""

    # -- plumbing ---------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of training samples."""
        return self.X.shape[0]

    @property
    def input_dim(self) -> int:
        """Input dimension d."""
        return self.X.shape[1]

    def _core(self, dtype) -> Any:
        dtype = np.dtype(dtype)
        if dtype not in self._cores:
            self._cores[dtype] = self._make_core("_f64" if dtype == np.float64 else "_f32")
        return self._cores[dtype]

    def _batch(self, w, name: str = "w") -> tuple[np.ndarray, bool]:
        return as_batch(w, self.dim, name)

    @staticmethod
    def _shape(x: np.ndarray, single: bool) -> np.ndarray:
        return x[0] if single else x

    # -- kernels ----------------------------------------------------------------
    @keeps_array_type
    def loss_and_grad(self, w) -> tuple[np.ndarray, np.ndarray]:
        """Loss L(w), shape () or (B,), and gradient grad L(w), shape of ``w``."""
        W, single = self._batch(w)
        loss, G, _ = self._core(W.dtype).loss_grad(W)
        return self._shape(loss, single), self._shape(G, single)

    @keeps_array_type
    def loss(self, w) -> np.ndarray:
        """Loss L(w) = (1/2n) sum_i (f(x_i; w) - y_i)^2, shape () or (B,)."""
        return self.loss_and_grad(w)[0]

    @keeps_array_type
    def grad(self, w) -> np.ndarray:
        """Gradient grad L(w), shape of ``w``."""
        return self.loss_and_grad(w)[1]

    @keeps_array_type
    def hvp(self, w, v) -> np.ndarray:
        """Exact Hessian-vector product H(w) v (forward-mode jets).

        ``v`` (D,) or (B, D); a single vector broadcasts against a batch.
        Away from interpolation this includes the residual term; the
        Gauss-Newton part alone is ``gauss_newton_hvp``.
        """
        return self._directional("hvp", w, v)

    @keeps_array_type
    def third(self, w, v) -> np.ndarray:
        """Exact third-order contraction D^3L(w)[v, v], the derivative of H(w) v along v.

        ``v`` (D,) or (B, D), broadcast as in ``hvp``; forward-mode jets of the loss.
        """
        return self._directional("third", w, v)

    def _directional(self, kernel: str, w, v) -> np.ndarray:
        W, single_w = self._batch(w)
        V, single_v = as_batch(v, self.dim, "v", dtype=W.dtype)
        if W.shape[0] == 1 and V.shape[0] > 1:
            W = np.repeat(W, V.shape[0], axis=0)
        elif V.shape[0] == 1 and W.shape[0] > 1:
            V = np.repeat(V, W.shape[0], axis=0)
        if W.shape != V.shape:
            raise ValueError(f"w has {W.shape[0]} rows but v has {V.shape[0]}; they must match "
                             "or one of them must be a single vector")
        out, _ = getattr(self._core(W.dtype), kernel)(np.ascontiguousarray(W),
                                                      np.ascontiguousarray(V))
        return self._shape(out, single_w and single_v)

    @keeps_array_type
    def hessian(self, w) -> np.ndarray:
        """Dense exact Hessian, (D, D) or (B, D, D), from D HVPs per point (small D only)."""
        W, single = self._batch(w)
        H, _ = self._core(W.dtype).hessian(W)
        return self._shape(H, single)

    @keeps_array_type
    def jacobians(self, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predictions and per-sample gradients on the training inputs.

        Returns
        -------
        f : ndarray, shape (n,) or (B, n)
            f(x_i; w).
        a : ndarray, shape (n, D) or (B, n, D)
            a_i = grad_W f(x_i; w).
        gx : ndarray, shape (n, d) or (B, n, d)
            grad_x f(x_i; w).
        """
        W, single = self._batch(w)
        F, A, GX = self._core(W.dtype).jacobians(W)
        return self._shape(F, single), self._shape(A, single), self._shape(GX, single)

    @keeps_array_type
    def predict(self, w) -> np.ndarray:
        """f(x_i; w) on the training inputs, shape (n,) or (B, n)."""
        return self.jacobians(w)[0]

    @keeps_array_type
    def param_gradients(self, w) -> np.ndarray:
        """Per-sample parameter gradients a_i = grad_W f(x_i; w), (n, D) or (B, n, D)."""
        return self.jacobians(w)[1]

    def jacobian_rows(self, w) -> np.ndarray:
        """The per-sample gradients as the rows pysharp.stability reads: (n, D) or (B, n, D)."""
        return self.param_gradients(w)

    def _run_sgd(self, W0: np.ndarray, *args) -> dict:
        """pysharp.sgd's engine for this model (validated arguments, after W0 (T, D)): the
        compiled core's SGD, csrc/cpu/sgd.hpp."""
        return self._core(W0.dtype).sgd(W0, *args)

    @keeps_array_type
    def input_gradients(self, w) -> np.ndarray:
        """Per-sample input gradients grad_x f(x_i; w), (n, d) or (B, n, d)."""
        return self.jacobians(w)[2]

    @keeps_array_type
    def gauss_newton_hvp(self, w, v) -> np.ndarray:
        """Gauss-Newton product G v = (1/n) sum_i a_i (a_i . v): the Hessian at interpolation."""
        W, single_w = self._batch(w)
        V, single_v = as_batch(v, self.dim, "v", dtype=W.dtype)
        A = self.jacobians(W)[1]
        out = np.einsum("bnd,bn->bd", A, np.einsum("bnd,bd->bn", A, V)) / self.n
        return self._shape(out, single_w and single_v)

    def random_point(self, batch: int | None = None, *, seed: int = 0, scale: float = 1.0,
                     dtype=np.float64) -> np.ndarray:
        """Standard initialisation: i.i.d. N(0, scale^2 / fan_in) entries, (D,) or (batch, D)."""
        rng = np.random.default_rng([as_positive_int(seed, "seed", minimum=0), 0x5CD])
        n = 1 if batch is None else as_positive_int(batch, "batch")
        w = (scale * rng.standard_normal((n, self.dim)) * self._init_scale()).astype(dtype)
        return w[0] if batch is None else w

    def _init_scale(self) -> np.ndarray:
        return np.full(self.dim, 1.0 / np.sqrt(self.input_dim))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, d={self.input_dim}, dim={self.dim})"


class LinearRegression(SquareLossModel):
    """Linear regression f(x) = w . x (+ b) on the square loss.

    Parameters
    ----------
    X : array_like, shape (n, d)
    y : array_like, shape (n,), optional
        Targets (zeros when omitted, e.g. for a model used only for its Jacobians).
    bias : bool
        Append an intercept b as the last parameter (D = d + 1); default False (D = d).

    Notes
    -----
    a_i = x_i (and 1 for the bias), so H_i = a_i a_i^T and H = X^T X / n:
    the setting where every stability quantity has a closed form.
    """

    def __init__(self, X, y=None, *, bias: bool = False) -> None:
        super().__init__(X, y)
        if not isinstance(bias, (bool, np.bool_)):
            raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
        self.bias = bool(bias)

    @property
    def dim(self) -> int:
        return self.input_dim + int(self.bias)

    def _make_core(self, suffix):
        dtype = np.float64 if suffix == "_f64" else np.float32
        return getattr(core(), "LinearRegression" + suffix)(self.X.astype(dtype),
                                                           self.y.astype(dtype), self.bias)

    def with_data(self, X, y=None) -> LinearRegression:
        return LinearRegression(X, y, bias=self.bias)

    def first_layer(self, w):
        W = np.asarray(w)
        return W[..., None, : self.input_dim], slice(0, self.input_dim)

    def spec(self) -> dict:
        return {"model": "linear_regression", "X": self.X, "y": self.y, "bias": self.bias}

    @classmethod
    def synthetic(cls, d: int = 10, n: int = 20, seed: int = 0, noise: float = 0.0,
                  bias: bool = False) -> LinearRegression:
        """A teacher-student instance: x ~ N(0, I_d), y = x . w_true (+ noise), ||w_true|| = 1.

        Parameters
        ----------
        d, n : int
            Input dimension and number of samples.
        seed : int
            Seed of numpy's default_rng (a stream apart from ``random_point``'s).
        noise : float
            Standard deviation of additive Gaussian label noise (0: w_true interpolates).
        bias : bool
            Fit an intercept too (the teacher has none).

        The teacher is kept as ``model.w_true`` (d,).
        """
        d = as_positive_int(d, "d")
        n = as_positive_int(n, "n")
        noise = as_real(noise, "noise", minimum=0.0)
        rng = np.random.default_rng(as_positive_int(seed, "seed", minimum=0))
        w_true = rng.standard_normal(d)
        w_true /= np.linalg.norm(w_true)
        X = rng.standard_normal((n, d))
        model = cls(X, X @ w_true + noise * rng.standard_normal(n), bias=bias)
        model.w_true = w_true
        return model


_ACTIVATIONS = {"tanh": 0, "relu": 1}


class TwoLayerNet(SquareLossModel):
    """Two-layer network f(x) = a . act(W1 x + b1) / sqrt(m) on the square loss.

    Parameters
    ----------
    d : int
        Input dimension.
    m : int
        Width (hidden units).
    activation : {"tanh", "relu"}
        Hidden activation (default "tanh"; relu's Hessian is that of its linear pieces).
    X : array_like, shape (n, d), optional
        Training inputs; without them the model only evaluates f and its
        gradients on inputs given through ``with_data``.
    y : array_like, shape (n,), optional
        Training targets (zeros when omitted).

    Notes
    -----
    Parameter layout, D = m d + 2 m: ``w[:m*d]`` is W1 (m, d) row-major,
    ``w[m*d:m*d+m]`` is b1, ``w[m*d+m:]`` is a. ``pack`` and ``unpack``
    convert. The first layer multiplies x, so
    ||grad_x f|| <= ||W1||_2 ||grad_W1 f||_F / ||x|| (Ma & Ying, Proposition 2).
    """

    def __init__(self, d: int, m: int, activation: str = "tanh", *, X=None, y=None) -> None:
        d = as_positive_int(d, "d")
        self.width = as_positive_int(m, "m")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.activation = activation
        if X is None:
            if y is not None:
                raise ValueError("y given without X")
            X = np.zeros((1, d))
            self._has_data = False
        else:
            self._has_data = True
        super().__init__(X, y)
        if self.input_dim != d:
            raise ValueError(f"X must have d = {d} columns, got shape {self.X.shape}")

    @property
    def dim(self) -> int:
        return self.width * self.input_dim + 2 * self.width

    def _make_core(self, suffix):
        dtype = np.float64 if suffix == "_f64" else np.float32
        return getattr(core(), "TwoLayerNet" + suffix)(self.X.astype(dtype), self.y.astype(dtype),
                                                      self.width, _ACTIVATIONS[self.activation])

    def _core(self, dtype):
        if not self._has_data:
            raise ValueError("this TwoLayerNet has no data: build it with X (and y), "
                             "or use model.with_data(X, y)")
        return super()._core(dtype)

    def with_data(self, X, y=None) -> TwoLayerNet:
        return TwoLayerNet(self.input_dim, self.width, self.activation, X=X, y=y)

    def unpack(self, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W1 (..., m, d), b1 (..., m), a (..., m)) views of w (..., D)."""
        w = np.asarray(w)
        m, d = self.width, self.input_dim
        return (w[..., : m * d].reshape(w.shape[:-1] + (m, d)), w[..., m * d: m * d + m],
                w[..., m * d + m:])

    def pack(self, W1, b1, a) -> np.ndarray:
        """The flat parameter vector(s) (..., D) from W1 (..., m, d), b1 and a (..., m)."""
        W1 = np.asarray(W1, dtype=float)
        return np.concatenate([W1.reshape(W1.shape[:-2] + (-1,)), np.asarray(b1, float),
                               np.asarray(a, float)], axis=-1)

    def first_layer(self, w):
        m, d = self.width, self.input_dim
        return self.unpack(w)[0], slice(0, m * d)

    def _init_scale(self) -> np.ndarray:
        m, d = self.width, self.input_dim
        return np.concatenate([np.full(m * d, 1 / np.sqrt(d)), np.zeros(m), np.ones(m)])

    def spec(self) -> dict:
        return {"model": "two_layer_net", "d": self.input_dim, "m": self.width,
                "activation": self.activation, "X": self.X if self._has_data else None,
                "y": self.y if self._has_data else None}

    @classmethod
    def synthetic(cls, d: int = 8, m: int = 16, n: int = 8, seed: int = 0,
                  activation: str = "tanh") -> TwoLayerNet:
        """A teacher-student instance: x ~ N(0, I_d), y = f(x; w_true) for a teacher of the
        same architecture (so an interpolating minimum exists).

        Parameters
        ----------
        d, m, n : int
            Input dimension, width and number of samples.
        seed : int
            Seed of numpy's default_rng (a stream apart from ``random_point``'s).
        activation : {"tanh", "relu"}

        The teacher's weights, drawn like the standard initialisation (W1 ~ N(0, 1/d),
        b1 = 0, a ~ N(0, 1)), are kept as ``model.w_true`` (D,).
        """
        rng = np.random.default_rng(as_positive_int(seed, "seed", minimum=0))
        d, n = as_positive_int(d, "d"), as_positive_int(n, "n")
        X = rng.standard_normal((n, d))
        teacher = cls(d, m, activation, X=X)
        w_true = rng.standard_normal(teacher.dim) * teacher._init_scale()
        model = cls(d, m, activation, X=X, y=teacher.predict(w_true))
        model.w_true = w_true
        return model

    def __repr__(self) -> str:
        n = self.n if self._has_data else 0
        return (f"TwoLayerNet(d={self.input_dim}, m={self.width}, activation={self.activation!r}, "
                f"n={n}, dim={self.dim})")


# SGD-only models: ``pysharp.sweep(name, method="sgd", ...)`` runs them by name.
SGD_PLOTS = ("final_loss", "rho_T2", "stable")
register(ModelEntry("linear_regression", LinearRegression, LinearRegression.synthetic,
                    plot_metrics=SGD_PLOTS))
register(ModelEntry("two_layer_net", TwoLayerNet, TwoLayerNet.synthetic,
                    plot_metrics=SGD_PLOTS))
