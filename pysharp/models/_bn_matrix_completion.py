from __future__ import annotations

import functools

import numpy as np

from .._backends import BACKENDS, resolve
from .._engine.validation import as_batch, as_float_array, as_positive_int
from ..reference import BNMatrixCompletionReference
from ._base import ScaleInvariantModel, bn_targets, check_scale_fits
from ._registry import ModelEntry, Summary, register


def _entries(rows, cols, values, shape, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate one set of observed entries (indices in range, no duplicates)."""
    names = [f"{label}rows", f"{label}cols", f"{label}values"]
    idx = []
    for name, a in zip(names[:2], (rows, cols)):
        a = np.asarray(a)
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
                a = a.astype(np.int64)
            else:
                raise TypeError(f"{name} must hold integer indices, got dtype {a.dtype}")
        idx.append(a.astype(np.int64))
    r, c = idx
    v = as_float_array(values, names[2], np.float64).copy()  # never alias the caller's array
    if not (r.shape == c.shape == v.shape):
        raise ValueError(f"{names[0]}, {names[1]} and {names[2]} must have equal lengths, "
                         f"got {r.shape[0]}, {c.shape[0]}, {v.shape}")
    for name, a, m in ((names[0], r, shape[0]), (names[1], c, shape[1])):
        bad = (a < 0) | (a >= m)
        if np.any(bad):
            k = int(np.argmax(bad))
            raise ValueError(f"{name}[{k}] = {a[k]} is out of range [0, {m})")
    flat = r * shape[1] + c
    uniq, first, counts = np.unique(flat, return_index=True, return_counts=True)
    if np.any(counts > 1):
        k = int(first[np.argmax(counts > 1)])
        raise ValueError(f"entry ({r[k]}, {c[k]}) appears more than once in "
                         f"{label or 'the observed '}entries; each entry may be observed once")
    return r.astype(np.int32), c.astype(np.int32), v


class BNMatrixCompletion(ScaleInvariantModel):
    """Matrix completion through a BatchNorm over the observed entries.

    Parameters w = concat(U.ravel(), V.ravel()), U (m1, r), V (m2, r),
    row-major, D = (m1 + m2) r. With scores s_k = <U[rows_k], V[cols_k]>
    over the N observed entries, and mu, sd their mean and std,
    p_k = std(values) (s_k - mu) / sd + mean(values) and
    L = mean_k (p_k - values_k)^2.

    Parameters
    ----------
    rows, cols : array_like of int, shape (N,)
        Observed positions, each pair at most once, N >= 2.
    values : array_like, shape (N,)
        Observed values, not all equal.
    shape : (int, int)
        Matrix shape (m1, m2).
    rank : int, >= 1
        Factorisation rank r.
    test : (rows, cols, values), optional
        Held-out entries for ``test_loss``.

    Notes
    -----
    L scales as var(values); its statistics are taken exactly at any scale of
    the values, which are refused (ValueError) where 2 var(values) is outside
    [2^-400, 2^400] ([2^-40, 2^40] for float32 kernels), beyond which the loss, its
    derivatives or the Lanczos solves of sharpness would over- or underflow.
    """

    _declared_as = ("bn_matrix_completion.hpp", "BNMatrixCompletion")

    _undefined_reason = ("all observed scores <U[rows_k], V[cols_k]> are equal, "
                         "so BatchNorm (and the loss) is undefined")

    def __init__(self, rows, cols, values, shape, rank, *, test=None) -> None:
        super().__init__()
        try:
            pair = tuple(shape)
        except TypeError:
            raise TypeError("shape must be a pair (m1, m2) of positive integers, "
                            f"got {shape!r}") from None
        if len(pair) != 2:
            raise ValueError(f"shape must be a pair (m1, m2), got {len(pair)} entries: {shape!r}")
        m1, m2 = (as_positive_int(s, "shape entry") for s in pair)
        self.shape = (m1, m2)
        self.rank = as_positive_int(rank, "rank")
        self.rows, self.cols, self.values = _entries(rows, cols, values, self.shape, "")
        if self.values.size < 2:
            raise ValueError(f"need N >= 2 observed entries, got {self.values.size}")
        if np.ptp(self.values) == 0:
            raise ValueError("values are constant: their std is 0, so the BN prediction is "
                             "undefined")
        self.test = None
        if test is not None:
            if len(test) != 3:
                raise ValueError("test must be a (rows, cols, values) triple")
            self.test = _entries(*test, self.shape, "test ")
            if self.test[2].size == 0:
                raise ValueError("test must hold at least one entry")
        targets = bn_targets(self.values, "values")
        self._u, self._scale = targets.u, targets.scale
        self._values_mean, self._values_std = targets.mean, targets.std

    @property
    def dim(self) -> int:
        return (self.shape[0] + self.shape[1]) * self.rank

    @property
    def n_obs(self) -> int:
        """Number of observed (training) entries N."""
        return self.values.size

    def _make_core(self, suffix, module):
        dtype = np.float64 if suffix == "_f64" else np.float32
        check_scale_fits(self._scale, dtype, "values")
        cls = getattr(module, "BNMatrixCompletion" + suffix)
        return cls(self.rows, self.cols, self._u.astype(dtype), self._scale,
                   self.shape[0], self.shape[1], self.rank)

    def _tile_kernel(self, module):
        # The device decides what fits in a block's shared memory: a thread per trajectory
        # (tile/bn_mc.hpp: 32 scratches of 2 D + N doubles), else a warp per trajectory
        # (tile/bn_mc_warp.hpp: one), else the engine.
        if module._tile_bn_mc_fits(self.dim, self.n_obs):
            run = module._tile_bn_mc_gd_wd
        elif module._tile_bn_mc_warp_fits(self.dim, self.n_obs):
            run = module._tile_bn_mc_warp_gd_wd
        else:
            return None
        return functools.partial(run, self.rows, self.cols, self._u, self._scale,
                                 self.shape[0], self.shape[1], self.rank)

    def _numba_params(self) -> tuple:
        from .._backends._numba_kernels import BN_MC, params  # lazy: numba is optional
        return params(BN_MC, rows=self.rows, cols=self.cols, u=self._u, scale=self._scale,
                      m1=self.shape[0], m2=self.shape[1], r=self.rank)

    def _reference(self):
        return BNMatrixCompletionReference(self.rows, self.cols, self.values, self.shape,
                                           self.rank)

    def spec(self) -> dict:
        return {"model": "bn_matrix_completion", "rows": self.rows, "cols": self.cols,
                "values": self.values, "shape": self.shape, "rank": self.rank,
                "test": self.test}

    def factors(self, w) -> tuple[np.ndarray, np.ndarray]:
        """Split w into U (..., m1, r) and V (..., m2, r) (views, no copy)."""
        W, single = as_batch(w, self.dim)
        m1, m2 = self.shape
        U = W[:, : m1 * self.rank].reshape(-1, m1, self.rank)
        V = W[:, m1 * self.rank:].reshape(-1, m2, self.rank)
        return (U[0], V[0]) if single else (U, V)

    def test_loss(self, w, *, backend: str = "auto") -> np.ndarray:
        """Held-out mean squared error with the training batch statistics, shape () or (B,).

        Raises ValueError when the model was built without ``test`` entries.
        """
        if self.test is None:
            raise ValueError("this model has no held-out entries; pass test=(rows, cols, values)")
        backend = resolve(backend, w, model=self)
        if BACKENDS[backend].gpu:  # a held-out evaluation, not a GPU kernel
            backend = resolve("auto")
        W, single = self._batch(w)
        W = self._unit_scale(W)[0]  # scale invariant
        rows, cols, values = self.test
        loss, ok = self._core(W.dtype, backend).test_loss(
            W, rows, cols, values.astype(W.dtype), self._values_mean, self._values_std)
        self._checked(ok)
        return self._shape(loss, single)

    @classmethod
    def synthetic(cls, size: int = 20, true_rank: int = 2, rank: int = 20,
                  n_obs: int | None = None, seed: int = 0) -> BNMatrixCompletion:
        """A random rank-``true_rank`` size x size matrix, partly observed.

        The truth is M = A B^T with A, B ~ N(0, 1) of shape (size, true_rank),
        kept as ``model.truth``. ``n_obs`` entries (default: half of them),
        drawn without replacement, are observed; all the others are held out
        for ``test_loss``.
        """
        size = as_positive_int(size, "size", minimum=2)
        true_rank = as_positive_int(true_rank, "true_rank")
        rank = as_positive_int(rank, "rank")
        total = size * size
        n_obs = total // 2 if n_obs is None else as_positive_int(n_obs, "n_obs", minimum=2)
        if n_obs >= total:
            raise ValueError(f"n_obs must be below size**2 = {total} to leave held-out entries")
        rng = np.random.default_rng(seed)
        truth = rng.standard_normal((size, true_rank)) @ rng.standard_normal((true_rank, size))
        perm = rng.permutation(total)
        train, held = np.sort(perm[:n_obs]), np.sort(perm[n_obs:])
        r, c = np.divmod(train, size)
        rt, ct = np.divmod(held, size)
        model = cls(r, c, truth[r, c], (size, size), rank, test=(rt, ct, truth[rt, ct]))
        model.truth = truth
        return model


def _truth_rank(model: BNMatrixCompletion) -> int | None:
    """Rank k of a synthetic model's truth when the fit could exceed it, else None."""
    truth = getattr(model, "truth", None)
    if truth is None:
        return None
    k = int(np.linalg.matrix_rank(truth))
    return k if 0 < k < min(min(model.shape), model.rank) else None


def _sv_gap(model: BNMatrixCompletion, w: np.ndarray) -> np.ndarray:
    k = _truth_rank(model)
    U, V = model.factors(w)
    sv = np.linalg.svd(U @ np.swapaxes(V, -1, -2), compute_uv=False)
    return sv[:, k] / sv[:, k - 1]


register(ModelEntry(
    "bn_matrix_completion", BNMatrixCompletion, BNMatrixCompletion.synthetic,
    summaries={
        "test_loss": Summary("held-out loss of the final w (NaN if diverged)",
                             lambda model, w: model.test_loss(w),
                             applies=lambda model: model.test is not None),
        "sv_gap": Summary("sigma_{k+1} / sigma_k of U V^T at the end, k = rank of the truth "
                          "(small = low rank found; NaN if diverged)", _sv_gap,
                          applies=lambda model: _truth_rank(model) is not None)},
    plot_metrics=("eos_entry_step", "sharpness_drop", "test_loss", "sv_gap")))
