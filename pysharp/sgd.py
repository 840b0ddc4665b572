"""Mini-batch SGD, a whole batch of trajectories in one core call.

Square-loss models: w_{t+1} = (1 - lr wd) w_t - lr (1/B) sum_{i in I_t} grad l_i(w_t),
with l_i = (f(x_i; w) - y_i)^2 / 2, so the batch gradient is unbiased for grad L,
L = (1/2n) sum_i (f(x_i; w) - y_i)^2.

``BNLinearRegression``: ghost batch normalisation, w_{t+1} = (1 - lr wd) w_t -
lr grad L_{I_t}(w_t), where L_I is the model's own loss on the sub-dataset
(X_I, y_I): the BN statistics, the centring of X and of y, and std(y) are all
the batch's (see ``BNLinearRegression.batch_loss_and_grad``).

Batches I_t are drawn with or without replacement from a counter-based RNG
keyed by (seed, trajectory, step): results are bit-identical for any thread
count and any split of a batch of trajectories into chunks (``first_trajectory``).

A JAX network (``pysharp.models.square_loss_from_jax``, k outputs per sample) trains in
XLA over the same batches (``sgd_batches``), l_i = ||f(x_i; w) - y_i||^2 / 2, with the
compiled engine's records and divergence rules (``pysharp._backends._jax_square_loss``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._backends import core_only
from ._engine.hyper import broadcast_batch, per_trajectory
from ._engine.loader import core
from ._engine.methods import method_spec
from ._engine.options import RunOptions
from ._engine.validation import as_positive_int, as_real
from .models import BNLinearRegression, SquareLossModel
from .models._kinds import require_sgd
from .models._xla_square_loss import XlaSquareLossModel


@dataclass
class SGDResult:
    """T SGD trajectories (or one, with the batch axis dropped).

    ``w`` (T, D) final iterates (a diverged trajectory keeps its last finite
    iterate); ``loss`` (records, T) full-batch loss at ``steps`` (NaN after
    divergence; for ``BNLinearRegression`` the model's loss with full-batch
    statistics, not a ghost-BN batch loss); ``diverged`` (T,) bool and ``diverged_step`` (T,) (-1 if
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


def _batch_sizes(batch, n: int, replacement: bool, minimum: int = 1,
                 why: str = "") -> np.ndarray:
    a = np.asarray(batch)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError(f"batch must be an integer or an array of integers, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"batch must be a scalar or a 1-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
        raise ValueError("batch sizes must be whole numbers")
    if np.any(a < minimum):
        raise ValueError(f"batch sizes must be >= {minimum}{why}, got {a.min()}")
    if not replacement and np.any(a > n):
        raise ValueError(f"batch sizes must be <= n = {n} without replacement, got {a.max()}")
    return a.astype(np.float64)


def run_sgd(model: SquareLossModel | BNLinearRegression | XlaSquareLossModel, w0, lr, batch,
            steps: int, *, wd=0.0,
            replacement: bool = False, record_every: int | None = None, seed: int = 0,
            first_trajectory: int = 0, max_loss: float = 1e100, backend: str = "auto") -> SGDResult:
    """Run mini-batch SGD (with optional weight decay) for a batch of trajectories.

    Parameters
    ----------
    model : SquareLossModel, BNLinearRegression or XlaSquareLossModel
        ``LinearRegression`` or ``TwoLayerNet`` with training data,
        ``BNLinearRegression`` (ghost BN, see Notes), or a JAX network from
        ``pysharp.models.square_loss_from_jax`` (k outputs; run in XLA, see Notes).
    w0 : array_like, shape (D,) or (T, D)
        Starts (for ``BNLinearRegression`` none with Xc w0 = 0).
    lr : float or array_like, shape (T,)
        Learning rates, > 0.
    batch : int or array_like of int, shape (T,)
        Batch sizes B, in [1, n] without replacement (>= 1 with); in [2, n]
        (>= 2 with replacement) for ``BNLinearRegression``.
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
    backend : {"auto", "cpp"}
        Core only: the compiled core runs this call; other backends are refused
        with a message. A JAX network runs in XLA: "auto" or "jax".

    Returns
    -------
    SGDResult
        Per-trajectory arrays drop the batch axis when every input was unbatched.

    Examples
    --------
    Linear regression with more samples than parameters: SGD with batch 2 interpolates.

    >>> import numpy as np
    >>> import pysharp as ps
    >>> model = ps.LinearRegression.synthetic(d=5, n=10, seed=0)
    >>> res = ps.run_sgd(model, np.zeros(5), 0.1, 2, 2000, seed=0)
    >>> bool(res.loss[-1] < 1e-20), bool(res.diverged)
    (True, False)

    Notes
    -----
    For ``BNLinearRegression`` the step is ghost BN, as BN nets are trained
    in practice: w <- (1 - lr lam) w - lr grad L_I(w), with L_I the model's
    loss evaluated on the sub-dataset (X_I, y_I) of the batch,

        L_I(w) = (1/B) sum_{i in I} (p_i - y_i)^2,
        p_i = std_I(y) (z_i - mean_I(z)) / std_I(z) + mean_I(y),  z = X w,

    i.e. ``BNLinearRegression(X[I], y[I]).loss(w)`` (population statistics over
    the batch; a batch with equal targets has L_I = 0). L_I is scale-invariant,
    so grad L_I(w) . w = 0, and E_I L_I != L: it is not an unbiased estimate of
    the full-batch loss. The step is undefined when X_I w is constant over the
    batch (always when all B indices are equal, which sampling with
    replacement can draw, with probability n^(1 - B) per step): that
    trajectory is flagged diverged at that step and frozen. Do not use small B
    with replacement on small n for that reason, and do not use it when you
    mean SGD with full-batch BN statistics (that is not what this computes).

    A JAX network (``square_loss_from_jax``) runs in XLA: the T trajectories vmapped,
    the steps between two recorded steps one jitted ``fori_loop``, over the batches
    ``sgd_batches`` draws for trajectories ``first_trajectory`` + 0 .. T - 1 (those the
    compiled engine draws), drawn before the run: (T, steps, max B) int32 indices must
    fit in memory (refused in words otherwise; split a long run into calls with other
    seeds). The recorded full-batch loss runs over chunks of ``model.chunk`` samples.
    It matches the compiled engine on the same network to rounding; for the small
    scalar models the compiled ``LinearRegression`` / ``TwoLayerNet`` run far faster.
    """
    options = RunOptions(steps=steps, record_every=record_every, seed=seed,
                         first_trajectory=first_trajectory, backend=backend,
                         replacement=replacement, max_loss=max_loss)
    return run_minibatch(model, w0, {"lr": lr, "batch": batch, "wd": wd}, method="sgd",
                         options=options)


def run_minibatch(model: SquareLossModel | BNLinearRegression | XlaSquareLossModel, w0,
                  hyper: Mapping[str, ArrayLike], *, method: str,
                  options: RunOptions) -> SGDResult:
    """One batch of a mini-batch ``method`` (a row of the method table whose engine is
    "minibatch": SGD), the entry under :func:`run_sgd` and ``pysharp.sweep``.

    ``hyper`` gives exactly the row's ``hyper`` (``lr``, ``batch``, ``wd``) less any of its
    ``optional`` ones (0 then), each a scalar or (T,); ``options`` the fields its row
    ``reads`` (steps, record_every, seed, first_trajectory, backend, replacement,
    max_loss), meant as :func:`run_sgd`'s arguments. Prefer :func:`run_sgd`.
    """
    spec = method_spec(method, engine="minibatch")
    if (not isinstance(hyper, Mapping) or not set(spec.required) <= set(hyper)
            or not set(hyper) <= set(spec.hyper)):
        got = sorted(hyper) if isinstance(hyper, Mapping) else type(hyper).__name__
        raise ValueError(f"method {method!r} takes the hyperparameters {list(spec.hyper)} "
                         f"({', '.join(spec.optional)} optional), got {got}")
    options.check_read_by(spec)
    backend, replacement = options.backend, options.replacement
    require_sgd(model, spec.runner)
    if model.jacobians_by == "xla":
        if backend not in ("auto", "jax"):
            raise ValueError(f"{spec.runner}: a square_loss_from_jax model runs in XLA; backend "
                             f"must be 'auto' or 'jax', got {backend!r}")
    else:
        core_only(backend, spec.runner)
    steps = as_positive_int(options.steps, "steps", minimum=0)
    record_every = options.record_every
    if record_every is None:
        record_every = max(1, steps // 100)
    record_every = as_positive_int(record_every, "record_every")
    seed = as_positive_int(options.seed, "seed", minimum=0)
    first_trajectory = as_positive_int(options.first_trajectory, "first_trajectory", minimum=0)
    max_loss = as_real(options.max_loss, "max_loss", minimum=0.0, strict=True)
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    lr_a = per_trajectory(hyper["lr"], "lr", positive=True)
    wd_a = per_trajectory(hyper.get("wd", 0.0), "wd")
    minimum, why = model.sgd_min_batch
    b_a = _batch_sizes(hyper["batch"], model.n, bool(replacement), minimum=minimum, why=why)
    dtype = np.asarray(w0).dtype if np.asarray(w0).dtype in (np.float32, np.float64) else np.float64
    W0, params, single = broadcast_batch(w0, model.dim, dtype, lr=lr_a, wd=wd_a, batch=b_a)
    B = params["batch"].astype(np.int32)
    args = (W0, params["lr"], B, params["wd"], steps, record_every, bool(replacement), seed,
            first_trajectory, max_loss)
    out = model._run_sgd(*args)
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
