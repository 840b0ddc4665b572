from __future__ import annotations

import functools

import numpy as np

from .._engine.loader import core
from .._engine.validation import as_positive_int, check_nonzero_rows
from ..reference import BNLinearRegressionReference
from ._base import (
    ScaleInvariantModel,
    bn_targets,
    bn_training_data,
    check_scale_fits,
    unit_scaled,
)
from ._registry import ModelEntry, Summary, register


class BNLinearRegression(ScaleInvariantModel):
    """Linear regression through a BatchNorm layer with fixed scale and shift.

    With centred data Xc = X - mean_rows(X) and z = Xc w, the prediction is
    p_i = std(y) z_i / sigma(w) + mean(y), sigma(w) = ||z|| / sqrt(n), and
    L(w) = mean_i (p_i - y_i)^2 = 2 var(y) (1 - cos(Xc w, y - mean y)).
    All means and standard deviations are population ones (divide by n).

    Parameters
    ----------
    X : array_like, shape (n, d)
        Inputs, n >= 2 samples of dimension d; not all rows equal.
    y : array_like, shape (n,)
        Targets, not all equal.

    Notes
    -----
    ``dim`` is d. The loss is undefined where Xc w = 0 (for n <= d that is
    only w = 0 in general position); such a w raises ValueError.

    Data of any scale: L does not depend on the scale of X, so the kernels see
    X / 2^k with entries of order one (exact: a power of two changes no
    mantissa), and y's statistics are taken on y / 2^l and scaled back. L
    scales as var(y): y is refused (ValueError) where 2 var(y) is outside
    [2^-400, 2^400] ([2^-40, 2^40] for float32 kernels), beyond which the loss, its
    derivatives or the Lanczos solves of sharpness would over- or underflow.
    """

    _declared_as = ("bn_linear_regression.hpp", "BNLinearRegression")

    _undefined_reason = "Xc @ w is zero, so BatchNorm (and the loss) is undefined"
    _has_reduced_engine = True

    def __init__(self, X, y) -> None:
        super().__init__()
        X, y = bn_training_data(X, y)
        if np.ptp(y) == 0:
            raise ValueError("y is constant: std(y) = 0, so the BN prediction is undefined")
        # X / 2^k: L is invariant to X's scale, and no sum of squares of Xc can over- or
        # underflow. Xc, the kernels' data, and every X-space result are taken from it.
        Xs, self._x_exp = unit_scaled(X)
        Xc = Xs - Xs.mean(axis=0)
        if not np.any(Xc):
            raise ValueError("all rows of X are equal: the centred data Xc is zero")
        targets = bn_targets(y, "y")
        self.X, self.y = X, y
        self.X.flags.writeable = self.y.flags.writeable = False
        self._Xs, self._Xc = Xs, Xc
        self._u, self._scale = targets.u, targets.scale
        self._y_mean, self._y_std = targets.mean, targets.std

    @property
    def dim(self) -> int:
        return self.X.shape[1]

    @property
    def n(self) -> int:
        """Number of samples."""
        return self.X.shape[0]

    def _tile_kernel(self, module):
        if not module._tile_bn_linreg_fits(self.dim, self.n):
            return None  # the module's tiles cover some (d, n) (their shapes are compiled in)
        return functools.partial(module._tile_bn_linreg_gd_wd, self._Xc, self._u, self._scale)

    def _make_core(self, suffix, module):
        dtype = np.float64 if suffix == "_f64" else np.float32
        check_scale_fits(self._scale, dtype, "y")
        cls = getattr(module, "BNLinearRegression" + suffix)
        # The engine's exact reduced update works in the singular basis of Xc.
        U, sigma, Vt = np.linalg.svd(self._Xc, full_matrices=False)
        keep = sigma > sigma[0] * max(self._Xc.shape) * np.finfo(float).eps
        U, sigma, V = U[:, keep], sigma[keep], Vt[keep].T
        ut = U.T @ self._u
        uperp2 = float(np.sum((self._u - U @ ut) ** 2))
        return cls(self._Xc.astype(dtype), self._u.astype(dtype), self._scale,
                   sigma.astype(dtype), ut.astype(dtype), np.ascontiguousarray(V, dtype), uperp2)

    def _numba_params(self) -> tuple:
        from .._backends._numba_kernels import BN_LINREG, params  # lazy: numba is optional
        return params(BN_LINREG, A=self._Xc, u=self._u, scale=self._scale,
                      extra=float(np.sum(self._Xc ** 2)))

    def _reference(self):
        return BNLinearRegressionReference(self._Xs, self.y)  # invariant to X's scale

    def spec(self) -> dict:
        return {"model": "bn_linear_regression", "X": self.X, "y": self.y}

    def min_norm_interpolant(self) -> np.ndarray:
        """wt* = pinv(Xc) (y - mean y), shape (d,): the minimum-norm interpolant on centred
        data, whose direction the sharpness-reduction flow converges to
        (:func:`pysharp.theory.min_norm_interpolant`)."""
        w = np.linalg.pinv(self._Xc) @ (self.y - self._y_mean)
        with np.errstate(over="ignore", under="ignore"):
            return np.ldexp(w, -self._x_exp)  # Xc is the data's over 2^k

    def effective_predictor(self, w) -> tuple[np.ndarray, np.ndarray]:
        """The affine predictor x -> wt . x + bt that the BN network computes.

        Returns
        -------
        wt : ndarray, shape (d,) or (B, d)
            std(y) w / sigma(w).
        bt : ndarray, shape () or (B,)
            mean(y) - wt . mean_rows(X).
        """
        W, single = self._batch(w)
        wt, bt = self._predictor(self._unit_scale(W)[0])  # they depend on the direction only
        with np.errstate(over="ignore", under="ignore"):
            wt = np.ldexp(wt, -self._x_exp)
        return self._shape(wt, single), self._shape(bt, single)

    def _predictor(self, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(wt, bt) of ``effective_predictor`` on the data's X / 2^k (wt 2^k times the
        data's own, bt the same) for checked rows W."""
        sigma = np.linalg.norm(W @ self._Xc.T.astype(W.dtype), axis=1) / np.sqrt(self.n)
        self._checked(sigma != 0)
        wt = (self._y_std / sigma)[:, None] * W
        return wt, self._y_mean - wt @ self._Xs.mean(axis=0)

    @classmethod
    def synthetic(cls, d: int = 40, n: int = 20, seed: int = 0,
                  noise: float = 0.0) -> BNLinearRegression:
        """The paper's setting: x ~ N(0, I_d), y = x . w_true (+ noise), ||w_true|| = 1.

        Parameters
        ----------
        d, n : int
            Input dimension and number of samples (paper: d = 40, n = 20).
        seed : int
            Seed of numpy's default_rng.
        noise : float
            Standard deviation of additive Gaussian label noise.

        The ground truth is kept as ``model.w_true`` (d,).
        """
        d = as_positive_int(d, "d")
        n = as_positive_int(n, "n", minimum=2)
        rng = np.random.default_rng(seed)
        w_true = rng.standard_normal(d)
        w_true /= np.linalg.norm(w_true)
        X = rng.standard_normal((n, d))
        y = X @ w_true + noise * rng.standard_normal(n)
        model = cls(X, y)
        model.w_true = w_true
        return model

    # -- ghost BN (the mini-batch loss of pysharp.run_sgd) ----------------------------
    def batch_loss_and_grad(self, w, batch) -> tuple[np.ndarray, np.ndarray]:
        """Ghost-BN loss and gradient of one mini-batch: the loss on the sub-dataset (X_I, y_I).

        L_I(w) = (1/B) sum_{i in I} (p_i - y_i)^2 with
        p_i = std_I(y) (z_i - mean_I(z)) / std_I(z) + mean_I(y), z = X w:
        the batch mean and std of z (BN statistics), the batch centring of X,
        and the batch mean and std of y all come from the B rows of the batch
        (population statistics, divide by B), so L_I(w) equals
        ``BNLinearRegression(X[I], y[I]).loss(w)`` (and is 0 when the batch's
        targets are all equal). This is the loss each step of
        ``pysharp.run_sgd`` descends on this model. Like L it is
        scale-invariant: L_I(c w) = L_I(w), grad L_I(w) . w = 0.

        Parameters
        ----------
        w : array_like, shape (d,) or (P, d)
        batch : array_like of int, shape (B,)
            Sample indices in [0, n), B >= 2; repeats allowed (sampling with
            replacement), a repeated row counts as often as it appears.

        Returns
        -------
        loss : ndarray, shape () or (P,)
        grad : ndarray, shape (d,) or (P, d)

        Raises
        ------
        ValueError
            For B < 2, an index out of range, or a w with X_I w constant over
            the batch (ghost BN undefined).
        """
        W, single = self._batch(w)
        idx = np.asarray(batch)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise ValueError(f"batch must be a 1-D array of integer indices, got {idx.dtype} "
                             f"with shape {idx.shape}")
        if idx.size < 2:
            raise ValueError(f"batch must hold >= 2 indices (ghost BN takes the batch's mean "
                             f"and std), got {idx.size}")
        if np.any(idx < 0) or np.any(idx >= self.n):
            raise ValueError(f"batch indices must be in [0, n = {self.n})")
        L, G, ok = core().bn_linreg_batch_loss_grad(self._core(W.dtype), W,
                                                    np.ascontiguousarray(idx, np.int32))
        if not np.all(ok):
            raise ValueError(f"w[{int(np.argmin(ok))}]: X[batch] @ w is constant over the "
                             "batch, so ghost BN (and the batch loss) is undefined")
        return self._shape(L, single), self._shape(G, single)

    # -- SGD linear stability (per-sample Jacobians of the predictions) ------------
    #: outputs per sample (k) and who computes the Jacobians (and runs SGD), as
    #: pysharp.stability and pysharp.sgd read them; the smallest SGD batch, and why
    outputs = 1
    jacobians_by = "core"
    sgd_min_batch = (2, " for BNLinearRegression (ghost BN takes the mean and std of each "
                        "batch, undefined for one sample)")

    def _run_sgd(self, W0: np.ndarray, *args) -> dict:
        """pysharp.sgd's engine for this model (validated arguments, after W0 (T, D)): ghost
        BN SGD in the compiled core, from starts where the loss is defined."""
        check_nonzero_rows(W0, "w0")
        self.loss(W0)  # a start where the loss is undefined is refused, not run
        return core().bn_linreg_sgd(self._core(W0.dtype), W0, *args)

    def param_gradients(self, w) -> np.ndarray:
        """a_i = grad_w p_i(w) for every training sample: (n, d) or (B, n, d)."""
        return self.per_sample_jacobians(w)[1]

    def jacobian_rows(self, w) -> np.ndarray:
        """The rows pysharp.stability reads: ``param_gradients``, (n, d) or (B, n, d)."""
        return self.param_gradients(w)

    def per_sample_jacobians(self, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predictions and their per-sample gradients, for the SGD stability analysis.

        With full-batch statistics, p_i(w) = std(y) z_i / sigma(w) + mean(y), z = Xc w.

        Returns
        -------
        p : ndarray, shape (n,) or (B, n)
            Predictions p_i(w).
        a : ndarray, shape (n, d) or (B, n, d)
            a_i = grad_w p_i(w) = std(y) sqrt(n) (Xc_i / ||z|| - z_i Xc^T z / ||z||^3).
            Orthogonal to w (p_i is scale-invariant).
        gx : ndarray, shape (n, d) or (B, n, d)
            grad_x p_i at frozen batch statistics (inference mode): std(y) w / sigma(w),
            the same for every sample.

        Notes
        -----
        This model's loss is (1/n) sum_i (p_i - y_i)^2, twice the (1/2n)
        convention of the stability theory; at an interpolating w its Hessian
        is 2 mean_i a_i a_i^T. ``pysharp.stability`` uses H = mean_i a_i a_i^T.
        """
        W, single = self._batch(w)
        Ws, e = self._unit_scale(W)
        A, GX, ok = core().bn_linreg_jacobians(self._core(W.dtype), Ws)
        self._checked(ok)
        A = self._scaled_back(A, e, 1)  # p is homogeneous of degree 0: a scales as 1/||w||
        with np.errstate(over="ignore", under="ignore"):
            GX = np.ldexp(GX, -self._x_exp)  # the core's inputs are X / 2^k
        wt, bt = self._predictor(Ws)
        p = wt @ self._Xs.T.astype(W.dtype) + bt[..., None]
        return self._shape(p, single), self._shape(A, single), self._shape(GX, single)


def _cosine_min_norm(model: BNLinearRegression, w: np.ndarray) -> np.ndarray:
    wt = model.min_norm_interpolant()
    # a row-wise sum, not a BLAS product: a row's value must not depend on the chunk
    return (w * wt).sum(axis=1) / (np.linalg.norm(w, axis=1) * np.linalg.norm(wt))


register(ModelEntry(
    "bn_linear_regression", BNLinearRegression, BNLinearRegression.synthetic,
    summaries={"cosine_min_norm": Summary(
        "cosine of the final w to the min-norm interpolant (NaN if diverged)",
        _cosine_min_norm)},
    plot_metrics=("eos_entry_step", "sharpness_drop", "cosine_min_norm", "final_sharpness")))
