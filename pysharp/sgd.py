"""Mini-batch SGD on square-loss models, a whole batch of trajectories in one core call.

w_{t+1} = (1 - lr wd) w_t - lr (1/B) sum_{i in I_t} grad l_i(w_t), with
l_i = (f(x_i; w) - y_i)^2 / 2, so the batch gradient is unbiased for grad L,
L = (1/2n) sum_i (f(x_i; w) - y_i)^2. Batches I_t are drawn with or without
replacement from a counter-based RNG keyed by (seed, trajectory, step):
results are bit-identical for any thread count and any split of a batch of
trajectories into chunks (``first_trajectory``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._backend import core
from ._hyper import broadcast_batch, per_trajectory
from ._validation import as_positive_int, as_real
from .models import SquareLossModel


@dataclass
class SGDResult:
    """T SGD trajectories (or one, with the batch axis dropped).

    ``w`` (T, D) final iterates (a diverged trajectory keeps its last finite
    iterate); ``loss`` (records, T) full-batch loss at ``steps`` (NaN after
    divergence); ``diverged`` (T,) bool and ``diverged_step`` (T,) (-1 if
    not); ``lr``, ``batch``, ``wd`` (T,) the per-trajectory hyperparameters.
    """

    w: np.ndarray
    steps: np.ndarray
    loss: np.ndarray
    diverged: np.ndarray
    diverged_step: np.ndarray
    lr: np.ndarray
    batch: np.ndarray
    wd: np.ndarray
    replacement: bool
    seed: int


def _batch_sizes(batch, n: int, replacement: bool) -> np.ndarray:
    a = np.asarray(batch)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError(f"batch must be an integer or an array of integers, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"batch must be a scalar or a 1-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
        raise ValueError("batch sizes must be whole numbers")
    if np.any(a < 1):
        raise ValueError(f"batch sizes must be >= 1, got {a.min()}")
    if not replacement and np.any(a > n):
        raise ValueError(f"batch sizes must be <= n = {n} without replacement, got {a.max()}")
    return a.astype(np.float64)


def run_sgd(model: SquareLossModel, w0, lr, batch, steps: int, *, wd=0.0,
            replacement: bool = False, record_every: int | None = None, seed: int = 0,
            first_trajectory: int = 0, max_loss: float = 1e100) -> SGDResult:
    """Run mini-batch SGD (with optional weight decay) for a batch of trajectories.

    Parameters
    ----------
    model : SquareLossModel
        ``LinearRegression`` or ``TwoLayerNet`` with training data.
    w0 : array_like, shape (D,) or (T, D)
        Starts.
    lr : float or array_like, shape (T,)
        Learning rates, > 0.
    batch : int or array_like of int, shape (T,)
        Batch sizes B, in [1, n] without replacement (>= 1 with).
    steps : int
        Number of SGD steps.
    wd : float or array_like, shape (T,)
        Weight decay lam >= 0: w <- (1 - lr lam) w - lr g.
    replacement : bool
        Draw each batch with replacement (B i.i.d. uniform indices) or without
        (a uniform B-subset; default).
    record_every : int, optional
        Full-batch loss every this many steps (default: steps // 100, at least 1).
    seed : int
        Key of the batch sampler.
    first_trajectory : int
        Global index of the first trajectory (its RNG stream); splitting a
        batch into chunks with matching offsets reproduces it bit for bit.
    max_loss : float
        A recorded full-batch loss above this (or a non-finite iterate) flags
        divergence; the trajectory is frozen, the rest of the batch completes.

    Returns
    -------
    SGDResult
        Per-trajectory arrays drop the batch axis when every input was unbatched.
    """
    if not isinstance(model, SquareLossModel):
        raise TypeError(f"model must be a pysharp square-loss model (LinearRegression, "
                        f"TwoLayerNet), got {type(model).__name__}")
    steps = as_positive_int(steps, "steps", minimum=0)
    if record_every is None:
        record_every = max(1, steps // 100)
    record_every = as_positive_int(record_every, "record_every")
    seed = as_positive_int(seed, "seed", minimum=0)
    first_trajectory = as_positive_int(first_trajectory, "first_trajectory", minimum=0)
    max_loss = as_real(max_loss, "max_loss", minimum=0.0, strict=True)
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    lr_a = per_trajectory(lr, "lr", positive=True)
    wd_a = per_trajectory(wd, "wd")
    b_a = _batch_sizes(batch, model.n, bool(replacement))
    dtype = np.asarray(w0).dtype if np.asarray(w0).dtype in (np.float32, np.float64) else np.float64
    W0, params, single = broadcast_batch(w0, model.dim, dtype, lr=lr_a, wd=wd_a, batch=b_a)
    B = params["batch"].astype(np.int32)
    out = model._core(W0.dtype).sgd(W0, params["lr"], B, params["wd"], steps, record_every,
                                    bool(replacement), seed, first_trajectory, max_loss)
    rec_steps = np.arange(steps // record_every + 1) * record_every
    res = SGDResult(out["w"], rec_steps, out["loss"], out["diverged"].astype(bool),
                    out["diverged_step"], params["lr"], B, params["wd"], bool(replacement), seed)
    if single:
        res.w, res.loss = res.w[0], res.loss[:, 0]
        res.diverged, res.diverged_step = res.diverged[0], res.diverged_step[0]
        res.lr, res.batch, res.wd = res.lr[0], res.batch[0], res.wd[0]
    return res


def sgd_batches(n: int, batch: int, steps: int, *, replacement: bool = False, seed: int = 0,
                trajectory: int = 0) -> np.ndarray:
    """The batches ``run_sgd`` draws for one trajectory: (steps, batch) sample indices.

    For writing an independent implementation (a NumPy oracle, a peer in a
    benchmark) that follows exactly the same samples.
    """
    n = as_positive_int(n, "n")
    batch = as_positive_int(batch, "batch")
    steps = as_positive_int(steps, "steps", minimum=0)
    if not replacement and batch > n:
        raise ValueError(f"batch must be <= n = {n} without replacement, got {batch}")
    return core().sgd_batches(n, batch, bool(replacement), as_positive_int(seed, "seed", minimum=0),
                              as_positive_int(trajectory, "trajectory", minimum=0), steps)
