"""Batched optimisation trajectories on scale-invariant models, run in the core.

A whole batch (all steps, all metrics, periodic sharpness by Lanczos) is one
call into C++; Python only validates the inputs and labels the regimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike

from ._backends import BACKENDS, resolve
from ._backends._tiles import tile_run
from ._engine import EngineConfig, LanczosOptions, Method
from ._engine.hyper import broadcast_batch, per_trajectory
from ._engine.methods import HYPERPARAMETERS, METHODS, method_spec
from ._engine.options import RunOptions
from ._engine.records import drop_batch_axis
from ._engine.validation import (
    SAFE_NORM2,
    as_positive_int,
    as_real,
    check_nonzero_rows,
    rows_in_safe_range,
)
from .models import ScaleInvariantModel
from .models._kinds import require_scale_invariant

STABLE, EOS, UNSTABLE = 0, 1, 2
REGIME_NAMES = ("stable", "eos", "unstable")


@dataclass
class Trajectory:
    """Recorded metrics of a batch of B trajectories.

    Recorded arrays are (records, B), or (records,) for an unbatched run:
    ``loss`` L(w_t), ``norm2`` ||w_t||^2, ``eff_lr`` the effective LR on the
    sphere, ``grad_norm`` ||grad L(theta_t)||, ``top_grad`` <v1, grad L(theta_t)>
    with v1 the latest top Hessian eigenvector (sign kept continuous; it
    alternates sign under the period-two EoS oscillation), all at ``steps``.
    ``sharpness`` S(theta_t) = lambda_1(H(theta_t)), ``eos_ratio``
    eff_lr * S and ``regime`` (STABLE, EOS or UNSTABLE, see ``REGIME_NAMES``)
    are (sharpness records, B) at ``sharpness_steps``.
    Per trajectory (B,): ``eos_entry_step`` (first sharpness step with
    eos_ratio >= 2 (1 - eos_tol), -1 if none), ``diverged`` and
    ``diverged_step`` (-1 if not). ``w`` is the final iterate (B, D); a
    diverged trajectory keeps its last finite iterate and its later records
    are NaN. ``theta`` (snapshots, B, D) at ``theta_steps`` when requested.
    ``group_norm2`` (records, B, G) at ``steps``: for a model whose loss is
    invariant to the scale of each of G parameter groups separately (the rows
    of ``BNTwoLayerNet``), each group's squared norm ||w_g||^2 (so its own
    effective LR, lr / ((1 - lr wd) ||w_g||^2)); None for single-group models.
    ``top_eigenvalues`` (sharpness records, B, k) at ``sharpness_steps`` with
    ``top_k = k >= 2``: the k largest eigenvalues of H(theta_t), descending
    (column 0 is the sharpness, from a separate solve); else None.
    ``hyper`` holds the method's hyperparameters by name, each (B,) (a scalar for an
    unbatched run); ``lr`` and ``wd`` are GD+WD's (pgd_adaptive: of the run it follows),
    and for a method on the sphere without them, ``lr`` is its ``eta`` and ``wd`` 0.
    ``meta`` says how the run was made: model, backend, dtype, jitter, seed, ``reduced``
    (BN linear regression's singular-basis update) and ``tiles`` (the fused GPU tiles ran
    it, pysharp._backends._tiles).
    """

    w: np.ndarray
    steps: np.ndarray
    loss: np.ndarray
    norm2: np.ndarray
    eff_lr: np.ndarray
    grad_norm: np.ndarray
    top_grad: np.ndarray | None
    sharpness_steps: np.ndarray
    sharpness: np.ndarray
    eos_ratio: np.ndarray
    sharpness_converged: np.ndarray
    regime: np.ndarray
    eos_entry_step: np.ndarray
    diverged: np.ndarray
    diverged_step: np.ndarray
    theta_steps: np.ndarray
    theta: np.ndarray | None
    lr: np.ndarray
    wd: np.ndarray
    method: str
    eos_tol: float
    group_norm2: np.ndarray | None = None
    top_eigenvalues: np.ndarray | None = None
    hyper: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def theta_final(self) -> np.ndarray:
        """Direction of the final iterate, w / ||w||."""
        return self.w / np.linalg.norm(self.w, axis=-1, keepdims=True)


def label_regimes(eos_ratio: np.ndarray, eos_tol: float) -> np.ndarray:
    """Regime codes from eff_lr * sharpness: STABLE below 2(1 - tol), EOS within
    2 tol of 2, UNSTABLE above 2(1 + tol); NaN (not reached) counts as STABLE."""
    regime = np.full(eos_ratio.shape, STABLE, dtype=np.int8)
    regime[eos_ratio >= 2 * (1 - eos_tol)] = EOS
    regime[eos_ratio > 2 * (1 + eos_tol)] = UNSTABLE
    return regime


def first_eos_step(regime: np.ndarray, sharpness_steps: np.ndarray) -> np.ndarray:
    """First sharpness step at or beyond the edge per trajectory, -1 if none."""
    reached = regime >= EOS
    first = np.where(reached.any(axis=0), sharpness_steps[np.argmax(reached, axis=0)]
                     if len(sharpness_steps) else -1, -1)
    return first.astype(np.int64)


def run_method(model: ScaleInvariantModel, w0, hyper: Mapping[str, ArrayLike],
               steps: int | None = None, *, method: str, options: RunOptions | None = None,
               **fields) -> Trajectory:
    """One batch of the engine's ``method`` (a row of ``pysharp._engine.methods.METHODS``).

    The table-driven entry under every ``run_*`` function and ``pysharp.sweep``. ``hyper``
    gives exactly the hyperparameters the method's ``MethodSpec.hyper`` names (see
    ``HYPERPARAMETERS``), each a scalar or (B,): ``{"lr": ..., "wd": ...}`` for GD+WD,
    ``{"eta": ...}`` for projected GD, ``{"eta": ..., "c": ...}`` for Quasi-RMSprop. Prefer
    the public ``run_*`` functions, which take them as arguments.

    The run's options are ``options``, a :class:`~pysharp._engine.options.RunOptions`, or
    ``steps`` and any of its fields as keywords (``RunOptions(steps=steps, **fields)``);
    their meanings are those of :func:`run_gd_wd`'s arguments. A field set away from its
    default that the method does not read (``rms_beta`` for GD+WD) is refused.
    """
    if options is None:
        if steps is None:
            raise TypeError("run_method needs steps (or options)")
        options = RunOptions(steps=steps, **fields)
    elif steps is not None or fields:
        raise TypeError("run_method takes options or steps and its fields, not both")
    o = options
    spec = method_spec(method, engine="trajectory")
    if not isinstance(hyper, Mapping) or set(hyper) != set(spec.hyper):
        got = sorted(hyper) if isinstance(hyper, Mapping) else type(hyper).__name__
        raise ValueError(f"method {method!r} takes the hyperparameters {list(spec.hyper)}, "
                         f"got {got}")
    o.check_read_by(spec)
    require_scale_invariant(model, spec.runner,
                            "use pysharp.run_sgd (batch = n for full-batch GD)")
    backend = resolve(o.backend, w0, trajectories=True, model=model)
    steps = as_positive_int(o.steps, "steps", minimum=0)
    record_every = as_positive_int(o.record_every if o.record_every is not None
                                   else max(1, steps // 1000), "record_every")
    sharpness_every = as_positive_int(o.sharpness_every if o.sharpness_every is not None
                                      else max(1, steps // 20), "sharpness_every", minimum=0)
    theta_every = as_positive_int(o.theta_every or 0, "theta_every", minimum=0)
    jitter = as_real(o.jitter, "jitter", minimum=0.0)
    seed = as_positive_int(o.seed, "seed", minimum=0)
    first_trajectory = as_positive_int(o.first_trajectory, "first_trajectory", minimum=0)
    top_k = as_positive_int(o.top_k, "top_k")
    if top_k > 1 and not sharpness_every:
        raise ValueError("top_k > 1 records eigenvalues at sharpness steps: "
                         "give sharpness_every > 0")
    eos_tol = as_real(o.eos_tol, "eos_tol", minimum=0.0)
    lanczos_tol = as_real(o.lanczos_tol, "lanczos_tol", minimum=0.0, strict=True)
    dtype = o.dtype
    if dtype is not None and np.dtype(dtype) not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    values = {name: per_trajectory(hyper[name], name,
                                   positive=HYPERPARAMETERS[name][1] == "> 0")
              for name in spec.hyper}
    W0, hyper, single = broadcast_batch(w0, model.dim, dtype, **values)
    check_nonzero_rows(W0, "w0")
    if spec.on_sphere:
        # Rows first scaled by powers of two: a norm that over- or underflows
        # would otherwise turn a valid start into a zero or NaN row.
        scaled, _ = model._unit_scale(W0)
        W0 = scaled / np.linalg.norm(scaled, axis=1, keepdims=True)
    reduced = o.reduced
    can_reduce = (model._has_reduced_engine and jitter == 0 and spec.reduced
                  and BACKENDS[backend].reduced)
    if reduced and not can_reduce:
        with_reduced = ", ".join(m.name for m in METHODS.values() if m.reduced)
        raise ValueError("reduced=True needs a model with a reduced engine (BNLinearRegression), "
                         f"a method that has one ({with_reduced}), jitter = 0 and the cpp or "
                         "cuda backend")
    # The reduced state carries no power-of-two scale (engine/bn_linreg_spectral.hpp): a start
    # whose squared norm leaves SafeNorm2's range runs in the full space, which rescales.
    in_range = rows_in_safe_range(W0)
    if reduced and not in_range:
        lo, hi = SAFE_NORM2[W0.dtype]
        raise ValueError("reduced=True needs starts with ||w0||^2 in "
                         f"({lo:.3g}, {hi:.3g}); the full-space engine (reduced=None or False) "
                         "runs any other norm exactly")
    reduced = can_reduce and in_range if reduced is None else bool(reduced)
    if spec.uses_wd and np.any(hyper["lr"].astype(float) * hyper["wd"] >= 1):
        raise ValueError("lr * wd must be < 1 (the decay factor 1 - lr wd must stay positive)")
    model.loss(W0, backend=backend)  # a start where the loss is undefined is refused, not run
    config = EngineConfig(
        method=Method.named(method), steps=steps, record_every=record_every,
        sharpness_every=sharpness_every, theta_every=theta_every, jitter=jitter, seed=seed,
        rms_beta=o.rms_beta, rms_eps=o.rms_eps, qr_kappa=o.qr_kappa, reduced=reduced,
        top_k=top_k if top_k > 1 else 0,
        lanczos=LanczosOptions.for_dim(model.dim, 1, o.lanczos_max_iter, tol=lanczos_tol,
                                       seed=seed, name="lanczos_max_iter"))
    tiles = BACKENDS[backend].tiles
    raw = tile_run(model, config, W0, hyper, tiles(), model._core(W0.dtype, backend),
                   first_trajectory) if tiles else None
    used_tiles = raw is not None
    if raw is None:
        raw = model._core(W0.dtype, backend).run(W0, hyper, config.to_core(), first_trajectory)

    return _trajectory(raw, steps=steps, record_every=record_every,
                       sharpness_every=sharpness_every, theta_every=theta_every, hyper=hyper,
                       method=method, eos_tol=eos_tol, single=single,
                       meta={"model": type(model).__name__, "jitter": jitter, "seed": seed,
                             "dtype": str(W0.dtype), "reduced": reduced, "backend": backend,
                             "tiles": used_tiles})


def _trajectory(raw: dict, *, steps: int, record_every: int, sharpness_every: int,
                theta_every: int, hyper: dict, method: str, eos_tol: float, single: bool,
                meta: dict) -> Trajectory:
    """The ``Trajectory`` of an engine's result ``raw`` (``_engine.records.RECORDS``, each
    with its batch axis), the regimes labelled; one trajectory's without its batch axis
    when ``single``."""
    sharpness_steps = np.arange(0, steps + 1, sharpness_every) if sharpness_every else \
        np.zeros(0, dtype=np.int64)
    regime = label_regimes(raw["eos_ratio"], eos_tol)
    entry = first_eos_step(regime, sharpness_steps)
    B = raw["w"].shape[0]
    lr, wd = hyper.get("lr", hyper.get("eta")), hyper.get("wd", np.zeros(B, raw["w"].dtype))
    if single:
        raw = drop_batch_axis(raw)
        regime, entry, lr, wd = regime[:, 0], entry[0], lr[0], wd[0]
        hyper = {k: v[0] for k, v in hyper.items()}
    return Trajectory(
        w=raw["w"], steps=np.arange(0, steps + 1, record_every),
        loss=raw["loss"], norm2=raw["norm2"], eff_lr=raw["eff_lr"], grad_norm=raw["grad_norm"],
        top_grad=raw["top_grad"] if sharpness_every else None,
        sharpness_steps=sharpness_steps, sharpness=raw["sharpness"], eos_ratio=raw["eos_ratio"],
        sharpness_converged=raw["sharpness_converged"].astype(bool), regime=regime,
        eos_entry_step=entry, diverged=raw["diverged"].astype(bool),
        diverged_step=raw["diverged_step"],
        theta_steps=np.arange(0, steps + 1, theta_every) if theta_every else
        np.zeros(0, dtype=np.int64),
        theta=raw["theta"] if theta_every else None, lr=lr, wd=wd, hyper=hyper, method=method,
        eos_tol=eos_tol, group_norm2=raw.get("group_norm2"),
        top_eigenvalues=raw.get("top_eigenvalues"), meta=meta)


_COMMON_DOC = """
    steps : int
        Number of updates; metrics are recorded at steps 0, record_every, ... <= steps.
    record_every : int, optional
        Record interval (default: steps // 1000, at least 1).
    sharpness_every : int, optional
        Spherical sharpness (Lanczos on the HVP, warm-started) every this many
        steps (default: steps // 20, at least 1); 0 turns it off, and with it
        ``top_grad`` and the regime labels.
    theta_every : int, optional
        Also store theta_t = w_t / ||w_t|| every this many steps (0: never).
    jitter : float
        sigma >= 0: each update adds sigma ||w_t|| xi_t, xi_t ~ N(0, I/D), from a
        counter-based RNG keyed by (seed, trajectory, step).
    seed : int
        Key of the jitter and of Lanczos' random starts.
    dtype : float32 or float64, optional
        Precision of the run (default: that of ``w0``, float64 for integers).
    backend : {"auto", "cpp", "numba", "cuda", "cupy"}
        Which engine runs the batch (see :func:`pysharp.backends`); "auto" takes
        the compiled core, else the Numba port.
    eos_tol : float
        Relative tolerance of the Edge of Stability: |eff_lr S - 2| <= 2 eos_tol.
    lanczos_tol, lanczos_max_iter
        Relative residual tolerance and Krylov dimension cap (default min(D, 128)).
    first_trajectory : int
        Global index of the first trajectory: it keys the random streams, so
        chunks of a large batch, each given its offset, reproduce the whole
        batch bit for bit.
    top_k : int
        With k >= 2, also record the k largest eigenvalues of H(theta) at each
        sharpness step (``Trajectory.top_eigenvalues``; Lanczos with locking, so
        repeated eigenvalues appear with their multiplicity). Costs about k times
        the sharpness solve; the other records do not change.

    Returns
    -------
    Trajectory
"""


@dataclass(frozen=True)
class QuasiRMSprop:
    """A Quasi-RMSprop scheduler for the effective LR of projected GD on the sphere.

    The class of schedulers for which the paper (Lyu, Li & Arora 2022, Appendix B)
    proves that PGD at the Edge of Stability tracks the sharpness-reduction flow.
    With g_t = grad L(theta_t),

        1/eta_{t+1}^2 = beta / eta_t^2 + c ||g_t||^2 + kappa c^2 ||g_t||^4 eta_t^2,
        c = (1 - beta) / lr^2,

    an RMSprop-like running average of ||g||^2 (kappa = 0: scalar RMSprop's
    scheduler, eta = lr / sqrt(v)), plus a fourth-order term that vanishes as
    beta -> 1. GD+WD's effective LR is one member (``from_gd_wd``); the theory's
    regime is 1 - beta = Theta(lr^2).

    Attributes
    ----------
    lr : float or array_like, shape (B,)
        Base learning rate, > 0.
    beta : float in (0, 1)
        Decay of the running average.
    kappa : float >= 0
        Coefficient of the fourth-order term.

    Notes
    -----
    The form is pysharp's reading of the paper's definition (whose appendix is
    not reproduced in this repository); ``from_gd_wd`` is checked to reproduce
    GD+WD bit for bit in exact arithmetic and to rounding in the tests.
    """

    lr: float | np.ndarray
    beta: float
    kappa: float = 0.0

    @property
    def c(self) -> np.ndarray:
        """(1 - beta) / lr^2, the coefficient of ||g||^2."""
        return (1.0 - self.beta) / np.asarray(self.lr, dtype=np.float64) ** 2

    @property
    def flow_time_per_step(self) -> np.ndarray:
        """lr^2 / 2: the interval of the sharpness-reduction flow one step tracks at EoS.

        The flow runs on the time scale (1 - beta) / (2 c); for GD+WD
        (``from_gd_wd``) this is (1 - beta) / (4 beta) = lr wd + O((lr wd)^2), the
        intrinsic LR of Theorem 4.7.
        """
        return np.asarray(self.lr, dtype=np.float64) ** 2 / 2

    @classmethod
    def from_gd_wd(cls, lr: float, wd: float) -> QuasiRMSprop:
        """GD+WD's scheduler: beta = (1 - lr wd)^4, base LR sqrt((1 - beta) / (2 beta)),
        kappa = 1 / (4 beta); PGD with it and eta_0 = lr / ((1 - lr wd) ||w0||^2) follows
        the directions of GD+WD from w0 (Lemma 3.1)."""
        d = (1.0 - float(lr) * float(wd)) ** 2
        beta = d * d
        return cls(lr=float(np.sqrt((1.0 - beta) / (2.0 * beta))), beta=beta,
                   kappa=1.0 / (4.0 * beta))


def run_gd_wd(model: ScaleInvariantModel, w0, lr, wd, steps: int, *,
              record_every: int | None = None, sharpness_every: int | None = None,
              theta_every: int = 0, jitter: float = 0.0, seed: int = 0, dtype=None,
              backend: str = "auto", eos_tol: float = 0.05, lanczos_tol: float = 1e-10,
              lanczos_max_iter: int | None = None, first_trajectory: int = 0,
              top_k: int = 1, reduced: bool | None = None) -> Trajectory:
    """Gradient descent with weight decay, w+ = (1 - lr wd) w - lr grad L(w).

    Parameters
    ----------
    model : ScaleInvariantModel
    w0 : array_like, shape (D,) or (B, D)
        Starting points, none zero.
    lr, wd : float or array_like, shape (B,)
        Learning rate (> 0) and weight decay (>= 0) per trajectory, lr wd < 1;
        a (D,) w0 broadcasts against them, so an lr x wd grid is one call.
    reduced : bool, optional
        BN linear regression only: carry the update in the singular basis of
        Xc (O(rank) per step instead of O(n d); exact algebra, equal to the
        direct update up to rounding). Default: whenever possible (jitter = 0).

    Examples
    --------
    The paper's BN linear regression: GD+WD reaches the Edge of Stability, where the
    effective LR times the spherical sharpness settles at 2.

    >>> import pysharp as ps
    >>> model = ps.BNLinearRegression.synthetic(d=40, n=20)
    >>> w0 = model.random_point(seed=0, norm=10.0)
    >>> tr = ps.run_gd_wd(model, w0, 0.5, 2e-4, 20_000, sharpness_every=500)
    >>> int(tr.eos_entry_step), bool(abs(tr.eos_ratio[-1] - 2) < 0.05)
    (18500, True)

    A list of learning rates is a batch, one trajectory each (-1: never at the edge):

    >>> ps.run_gd_wd(model, w0, [0.1, 0.5], 2e-4, 20_000, sharpness_every=500).eos_entry_step
    array([   -1, 18500])
    """
    options = RunOptions(steps=steps, record_every=record_every,
                         sharpness_every=sharpness_every, theta_every=theta_every,
                         jitter=jitter, seed=seed, dtype=dtype, backend=backend, eos_tol=eos_tol,
                         lanczos_tol=lanczos_tol, lanczos_max_iter=lanczos_max_iter,
                         first_trajectory=first_trajectory, top_k=top_k, reduced=reduced)
    return run_method(model, w0, {"lr": lr, "wd": wd}, method="gd_wd", options=options)


def run_pgd(model: ScaleInvariantModel, theta0, eff_lr, steps: int, *, lr=None, wd=None,
            record_every: int | None = None, sharpness_every: int | None = None,
            theta_every: int = 0, jitter: float = 0.0, seed: int = 0, dtype=None,
            backend: str = "auto", eos_tol: float = 0.05, lanczos_tol: float = 1e-10,
            lanczos_max_iter: int | None = None, first_trajectory: int = 0,
            top_k: int = 1, scheduler: QuasiRMSprop | None = None) -> Trajectory:
    """Projected GD on the unit sphere, theta+ = Pi(theta - eta_t grad L(theta)).

    With only ``eff_lr`` the effective LR eta_t is constant. With ``lr`` and
    ``wd`` too, eta_0 = eff_lr and eta_t follows the GD+WD recursion
    1/eta_{t+1} = (1 - lr wd)^2 (1/eta_t + eta_t ||grad L(theta_t)||^2), so the
    run reproduces the directions of GD+WD from any w0 with
    eff_lr = lr / ((1 - lr wd) ||w0||^2) (Lemma 3.1). With ``scheduler`` (a
    :class:`QuasiRMSprop`) instead, eta_0 = eff_lr and eta_t follows that scheduler.

    Parameters
    ----------
    theta0 : array_like, shape (D,) or (B, D)
        Starting directions (normalised on entry).
    eff_lr : float or array_like, shape (B,)
        The (initial) effective learning rate, > 0.

    Examples
    --------
    With a constant effective LR eta the sharpness climbs to the edge 2 / eta and stays:

    >>> import pysharp as ps
    >>> model = ps.BNLinearRegression.synthetic(d=40, n=20)
    >>> theta0 = model.random_point(seed=0)
    >>> tr = ps.run_pgd(model, theta0, 0.3, 3000, sharpness_every=100)
    >>> int(tr.eos_entry_step), round(float(tr.norm2[-1]), 12)
    (100, 1.0)
    """
    if (lr is None) != (wd is None):
        raise ValueError("give both lr and wd (adaptive effective LR) or neither (constant)")
    per_trajectory(eff_lr, "eff_lr", positive=True)  # refused by the name the caller used
    options = RunOptions(steps=steps, record_every=record_every,
                         sharpness_every=sharpness_every, theta_every=theta_every,
                         jitter=jitter, seed=seed, dtype=dtype, backend=backend, eos_tol=eos_tol,
                         lanczos_tol=lanczos_tol, lanczos_max_iter=lanczos_max_iter,
                         first_trajectory=first_trajectory, top_k=top_k)
    if scheduler is not None:
        if lr is not None:
            raise ValueError("give lr and wd (GD+WD's scheduler) or scheduler, not both")
        if not isinstance(scheduler, QuasiRMSprop):
            raise TypeError(f"scheduler must be a QuasiRMSprop, got {type(scheduler).__name__}")
        beta = as_real(scheduler.beta, "scheduler.beta", minimum=0.0, strict=True)
        if beta >= 1:
            raise ValueError(f"scheduler.beta must be < 1, got {beta}")
        kappa = as_real(scheduler.kappa, "scheduler.kappa", minimum=0.0)
        per_trajectory(scheduler.lr, "scheduler.lr", positive=True)
        tr = run_method(model, theta0, {"eta": eff_lr, "c": scheduler.c},
                        method="pgd_quasi_rmsprop",
                        options=replace(options, rms_beta=beta, qr_kappa=kappa))
        # the sharpness-reduction flow's time per step (pysharp.flow.compare_to_flow)
        tr.meta["flow_time_per_step"] = scheduler.flow_time_per_step
        return tr
    if lr is None:
        return run_method(model, theta0, {"eta": eff_lr}, method="pgd", options=options)
    return run_method(model, theta0, {"eta": eff_lr, "lr": lr, "wd": wd},
                      method="pgd_adaptive", options=options)


def run_scalar_rmsprop(model: ScaleInvariantModel, w0, lr, wd, steps: int, *,
                       beta: float = 0.99, eps: float = 1e-12,
                       record_every: int | None = None, sharpness_every: int | None = None,
                       theta_every: int = 0, jitter: float = 0.0, seed: int = 0, dtype=None,
                       backend: str = "auto", eos_tol: float = 0.05,
                       lanczos_tol: float = 1e-10,
                       lanczos_max_iter: int | None = None,
                       first_trajectory: int = 0, top_k: int = 1) -> Trajectory:
    """RMSprop with one scalar second moment (the paper's Appendix B variant).

    v_t = beta v_{t-1} + (1 - beta) ||grad L(w_t)||^2 (v_{-1} = 0),
    w+ = (1 - lr wd) w - lr grad L(w) / (sqrt(v_t) + eps).
    ``eff_lr`` records lr / ((sqrt(v_t) + eps)(1 - lr wd) ||w_t||^2).

    Parameters
    ----------
    model, w0, lr, wd
        As in ``run_gd_wd``.
    beta : float in [0, 1)
        Decay of the second-moment average.
    eps : float >= 0
        Added to sqrt(v_t).
    """
    beta = as_real(beta, "beta", minimum=0.0)
    if beta >= 1:
        raise ValueError(f"beta must be < 1, got {beta}")
    eps = as_real(eps, "eps", minimum=0.0)
    options = RunOptions(steps=steps, record_every=record_every,
                         sharpness_every=sharpness_every, theta_every=theta_every,
                         jitter=jitter, seed=seed, dtype=dtype, backend=backend, eos_tol=eos_tol,
                         lanczos_tol=lanczos_tol, lanczos_max_iter=lanczos_max_iter,
                         first_trajectory=first_trajectory, top_k=top_k, rms_beta=beta,
                         rms_eps=eps)
    return run_method(model, w0, {"lr": lr, "wd": wd}, method="scalar_rmsprop",
                      options=options)


for _f in (run_gd_wd, run_pgd, run_scalar_rmsprop):  # the common parameters before Examples
    _head, _examples, _tail = _f.__doc__.rstrip().partition("\n    Examples\n")
    _f.__doc__ = _head + "\n" + _COMMON_DOC + (_examples + _tail if _examples else "")
