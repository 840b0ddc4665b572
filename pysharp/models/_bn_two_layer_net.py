from __future__ import annotations

import numpy as np

from .._engine.validation import as_positive_int, as_real
from ..reference import BNTwoLayerNetReference
from ._base import ScaleInvariantModel, bn_training_data, check_data_range, unit_scaled
from ._registry import ModelEntry, Summary, register

_ACTIVATIONS = {"tanh": 0, "relu": 1}
_Y_REMEDY = "rescale y (the network's outputs are of order one)"


def _log2_peak(y: np.ndarray) -> float:
    """log2 max |y| (-inf for y = 0)."""
    peak = float(np.max(np.abs(y)))
    if peak == 0:
        return -np.inf
    m, e = np.frexp(peak)
    return float(np.log2(m)) + int(e)


class BNTwoLayerNet(ScaleInvariantModel):
    """A two-layer network with BatchNorm on its hidden units: the smallest real BN network.

    With W (m, d) the hidden weights (``w = W.ravel()``, row-major, D = m d),
    z_ij = W_j . x_i, each unit is batch-normalised over the n samples without
    affine, zhat_ij = (z_ij - mean_i z_ij) / std_i z_ij (population std), and the
    output weights are fixed: f(x_i) = sum_j a_j act(zhat_ij), a_j = (-1)^j / sqrt(m).
    L(w) = mean_i (f(x_i) - y_i)^2.

    L is invariant to the positive scale of each row W_j separately (so also to
    the scale of w): every row has its own norm and, under GD+WD, its own
    effective learning rate lr / ||W_j||^2 (``row_norms``; the engine records the
    squared row norms as ``Trajectory.group_norm2``).

    Parameters
    ----------
    X : array_like, shape (n, d)
        Inputs, n >= 2 samples; not all rows equal.
    y : array_like, shape (n,)
        Targets (not normalised).
    width : int
        Hidden units m >= 1.
    activation : {"tanh", "relu"}

    Notes
    -----
    The loss is undefined where some unit's output X W_j is constant over the
    samples (std 0, so BatchNorm divides by zero), in particular where a row of
    W is zero; such a w raises ValueError. With relu, derivatives at a kink
    (zhat_ij = 0) are those of the right-hand branch's complement (act' = 0 at 0).

    Data of any scale: L does not depend on the scale of X, so the kernels see
    X / 2^k with entries of order one (exact: a power of two changes no
    mantissa). y is not normalised: it is refused (ValueError) where max |y|^2
    is above 2^400 (2^40 for float32 kernels), beyond which the loss (f - y)^2, its
    derivatives or the Lanczos solves of sharpness would overflow.
    """

    _declared_as = ("bn_two_layer_net.hpp", "BNTwoLayerNet")
    _backends = ("cpp", "cuda", "cupy", "jax", "numpy")  # no Numba port (_backends._fallback)

    _undefined_reason = ("some hidden unit's output X @ W_j is constant over the samples, "
                         "so its BatchNorm (and the loss) is undefined")

    def __init__(self, X, y, width: int, activation: str = "tanh") -> None:
        super().__init__()
        X, y = bn_training_data(X, y)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.width = as_positive_int(width, "width")
        self.activation = activation
        Xs, _ = unit_scaled(X)  # L is invariant to X's scale: no sum of squares overflows
        Xc = Xs - Xs.mean(axis=0)
        if not np.any(Xc):
            raise ValueError("all rows of X are equal: every hidden unit is constant")
        self._y_log2 = _log2_peak(y)
        check_data_range(2 * self._y_log2, np.float64, "max |y|^2", _Y_REMEDY, lower=False)
        self.X, self.y = X, y
        self.X.flags.writeable = self.y.flags.writeable = False
        self._Xs, self._Xc = Xs, Xc

    @property
    def dim(self) -> int:
        return self.width * self.X.shape[1]

    @property
    def group_bounds(self) -> np.ndarray:
        """Offsets of the parameter groups, the rows of W: row j is ``w[j d:(j + 1) d]``."""
        return np.arange(self.width + 1, dtype=np.int64) * self.X.shape[1]

    @property
    def n(self) -> int:
        """Number of samples."""
        return self.X.shape[0]

    def _make_core(self, suffix, module):
        dtype = np.float64 if suffix == "_f64" else np.float32
        check_data_range(2 * self._y_log2, dtype, "max |y|^2", _Y_REMEDY, lower=False)
        return getattr(module, "BNTwoLayerNet" + suffix)(
            self._Xc.astype(dtype), self.y.astype(dtype), self.width,
            _ACTIVATIONS[self.activation])

    def _reference(self):
        return BNTwoLayerNetReference(self._Xs, self.y, self.width, self.activation)

    def spec(self) -> dict:
        return {"model": "bn_two_layer_net", "X": self.X, "y": self.y, "width": self.width,
                "activation": self.activation}

    def unpack(self, w) -> np.ndarray:
        """The hidden weights W, shape (m, d) or (B, m, d) (a view of ``w``)."""
        W, single = self._batch(w)
        W = W.reshape(-1, self.width, self.X.shape[1])
        return W[0] if single else W

    def row_norms(self, w) -> np.ndarray:
        """||W_j|| per hidden unit, shape (m,) or (B, m): each row's own scale."""
        return np.linalg.norm(self.unpack(w), axis=-1)

    def predict(self, w) -> np.ndarray:
        """Network outputs f(x_i) on the training inputs (batch statistics), (n,) or (B, n)."""
        W, single = self._batch(w)
        out = self._reference().predictions(self._unit_scale(W)[0].astype(np.float64))
        return out[0] if single else out

    @classmethod
    def synthetic(cls, n: int = 32, d: int = 8, width: int = 8, teacher_width: int = 4,
                  activation: str = "tanh", seed: int = 0,
                  noise: float = 0.0) -> BNTwoLayerNet:
        """Teacher-student data: x ~ N(0, I_d), y = the same network with ``teacher_width`` units.

        The teacher's rows are N(0, I_d), kept as ``model.teacher`` (teacher_width, d);
        its output weights are (-1)^j / sqrt(teacher_width). With ``width ==
        teacher_width`` the teacher itself is a minimiser (loss 0); a wider student
        cannot copy it exactly (its output weights are fixed at 1 / sqrt(width)) but,
        with D = width d comparable to n or larger, typically fits the data to
        interpolation, so GD+WD reaches the Edge of Stability near its minimisers.

        Parameters
        ----------
        n, d : int
            Samples (>= 2) and input dimension.
        width, teacher_width : int
            Hidden units of the student (the model) and of the teacher.
        activation : {"tanh", "relu"}
            Used by both.
        seed : int
            Seed of numpy's default_rng.
        noise : float
            Standard deviation of additive Gaussian label noise.
        """
        n = as_positive_int(n, "n", minimum=2)
        d = as_positive_int(d, "d")
        teacher_width = as_positive_int(teacher_width, "teacher_width")
        noise = as_real(noise, "noise", minimum=0.0)
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, d))
        teacher = rng.standard_normal((teacher_width, d))
        y = BNTwoLayerNetReference(X, np.zeros(n), teacher_width, activation).predictions(
            teacher.ravel()[None])[0]
        y = y + noise * rng.standard_normal(n)
        model = cls(X, y, width, activation)
        model.teacher = teacher
        return model


def _row_norm_spread(model: BNTwoLayerNet, w: np.ndarray) -> np.ndarray:
    norms = model.row_norms(w)
    return norms.max(axis=1) / norms.min(axis=1)


register(ModelEntry(
    "bn_two_layer_net", BNTwoLayerNet, BNTwoLayerNet.synthetic,
    summaries={"row_norm_ratio": Summary(
        "max_j ||W_j|| / min_j ||W_j|| at the end: how far the rows' own effective LRs "
        "lr / ||W_j||^2 spread (NaN if diverged)", _row_norm_spread)},
    plot_metrics=("eos_entry_step", "sharpness_drop", "final_loss", "row_norm_ratio")))
