"""One sweep chunk: a contiguous block of grid points, run as one engine call.

The methods the method table (``pysharp._engine.methods.ALL_METHODS``) marks ``sweep`` share
the machinery: ``gd_wd`` (:func:`pysharp.run_gd_wd`), ``pgd`` (:func:`pysharp.run_pgd`,
constant effective LR on the unit sphere) and ``scalar_rmsprop``
(:func:`pysharp.run_scalar_rmsprop`) today, each run through
:func:`pysharp.dynamics.run_method`, and ``sgd`` (:func:`pysharp.run_sgd`), run through
:func:`pysharp.sgd.run_minibatch`. A row's ``engine`` picks its ``Chunks`` (what a chunk
records and summarises), its ``grid_axes`` its grid (``METHOD_DIMS``), and
``Settings.run_options`` the one ``RunOptions`` its runner takes.

``compute_chunk`` is what an executor runs; it takes and returns plain data
(a spec, the grid, numbers, NumPy arrays), so it pickles to any process or
machine. Everything here is deterministic: a chunk computed anywhere, in any
order, gives the same bytes, because the engine keys its random streams by
the global trajectory index (``first_trajectory``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from .._engine.methods import ALL_METHODS, MethodSpec, method_spec
from .._engine.options import RunOptions
from ..dynamics import run_method
from ..models import ScaleInvariantModel
from ..models._registry import entry_of
from ..sgd import run_minibatch
from ..sharpness import spherical_sharpness
from ..stability import second_moment_operator
from . import _spec

#: Grid dimensions of a GD-type sweep, in the order of the Dataset's axes
#: (trajectories are laid out flat in this C order).
GRID_DIMS = ALL_METHODS["gd_wd"].grid_axes

#: The methods ``pysharp.sweep`` runs -> their grid dimensions (C order): the method
#: table's swept rows.
METHOD_DIMS = {name: m.grid_axes for name, m in ALL_METHODS.items() if m.sweep}

#: Every grid axis of any method.
ALL_GRID_DIMS = tuple(dict.fromkeys(d for dims in METHOD_DIMS.values() for d in dims))

#: Recorded metrics: name -> record axis.
RECORDED = {"loss": "step", "norm2": "step", "eff_lr": "step",
            "sharpness": "sharpness_step", "eos_ratio": "sharpness_step"}

#: The recorded metrics of a mini-batch sweep (``pysharp.SGDResult`` records the loss only).
SGD_RECORDED = {"loss": "step"}

#: A point counts as linearly stable when rho(T_2) <= 1 + this (rounding of the
#: eigenvalues), the slack of :func:`pysharp.stability.is_linearly_stable`.
STABLE_RTOL = 1e-9

SUMMARY_DOC = {
    "eos_entry_step": "first sharpness step with eff_lr * sharpness >= 2 (1 - eos_tol); -1: never",
    "diverged": "the trajectory left the finite numbers (its later records are NaN)",
    "diverged_step": "step of divergence; -1: did not diverge",
    "final_loss": "training loss at the last step (NaN if diverged)",
    "final_eff_lr": "effective LR lr / ((1 - lr wd) ||w||^2) at the last step (NaN if diverged)",
    "final_sharpness": "spherical sharpness at the last sharpness step (NaN if diverged)",
    "min_sharpness": "smallest spherical sharpness recorded before divergence",
    "sharpness_drop": "peak sharpness recorded up to EoS entry minus the end sharpness, the mean "
                      "of S(w_T) and S(w_T+1) over the two phases of the period-two oscillation "
                      "(NaN: never entered, diverged, or entered before the first sharpness record "
                      "after step 0, which leaves the peak unrecorded)",
}  # the models' own summaries document themselves in the registry (``summary_doc``)

SGD_SUMMARY_DOC = {
    "diverged": SUMMARY_DOC["diverged"],
    "diverged_step": SUMMARY_DOC["diverged_step"],
    "final_loss": "full-batch training loss at the last record (NaN if diverged)",
    "rho_T2": "spectral radius of the second-moment operator T_2 of linearised SGD at the final "
              "iterate for the point's lr and batch (pysharp.stability.second_moment_operator; "
              "exact at an interpolating minimum, the Gauss-Newton linearisation elsewhere; NaN "
              "if diverged)",
    "stable": f"linearly stable at the final iterate: rho_T2 <= 1 (+ {STABLE_RTOL:g} for "
              "rounding); False if diverged",
}


def summary_doc(model: ScaleInvariantModel, method: str = "gd_wd") -> dict[str, str]:
    """Descriptions of every summary variable of a ``method`` sweep of ``model``."""
    base = CHUNKS[method_spec(method).engine].summary_doc
    return base | {name: s.doc for name, s in _model_summaries(model).items()}


def _model_summaries(model: ScaleInvariantModel) -> dict:
    """The registry's summaries that apply to this model instance."""
    return {name: s for name, s in entry_of(model).summaries.items() if s.applies(model)}


@dataclass(frozen=True)
class Settings:
    """Everything besides the grid that determines a sweep's numbers."""

    steps: int
    record_every: int
    sharpness_every: int
    jitter: float
    eos_tol: float
    backend: str
    method: str = "gd_wd"
    rms_beta: float | None = None  # methods whose MethodSpec.options name it
    rms_eps: float | None = None  # likewise
    replacement: bool | None = None  # the minibatch engine's (SGD)

    @property
    def spec(self) -> MethodSpec:
        """The method's row of the table."""
        return method_spec(self.method)

    @property
    def chunks(self) -> Chunks:
        """How its engine's chunks run and are summarised."""
        return CHUNKS[self.spec.engine]

    @property
    def dims(self) -> tuple[str, ...]:
        """The grid axes of this method, in C order."""
        return METHOD_DIMS[self.method]

    @property
    def recorded(self) -> dict[str, str]:
        """The recorded metrics of this method: name -> record axis."""
        return self.chunks.recorded

    def run_options(self, first_trajectory: int) -> RunOptions:
        """The ``RunOptions`` of a chunk whose first flat trajectory is ``first_trajectory``:
        the settings the method reads (its row's ``reads``), seed 0 (a grid's seeds are its
        starts)."""
        given = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name in self.spec.reads and getattr(self, f.name) is not None}
        return RunOptions(**given, seed=0, first_trajectory=first_trajectory)

    def identity(self) -> dict:
        """The settings as stored in a sweep's identity: the method is stored beside them, and
        a setting another method has not (None) is left out, so a GD+WD sweep's identity is
        what it was before other methods existed."""
        return {k: v for k, v in self.__dict__.items() if k != "method" and v is not None}

    def record_steps(self) -> dict[str, np.ndarray]:
        steps = np.arange(0, self.steps + 1, self.record_every)
        sharp = (np.arange(0, self.steps + 1, self.sharpness_every) if self.sharpness_every
                 else np.zeros(0, dtype=np.int64))
        return {"step": steps, "sharpness_step": sharp}


def layout(model: ScaleInvariantModel, settings: Settings) -> dict[str, tuple[tuple, str]]:
    """Per-trajectory outputs of a chunk: name -> (shape after the trajectory axis, dtype)."""
    lengths = {k: len(v) for k, v in settings.record_steps().items()}
    out = {name: ((lengths[axis],), "float64") for name, axis in settings.recorded.items()
           if lengths[axis] or axis == "step"}
    out.update(settings.chunks.summaries(settings))
    out.update({name: ((), "float64") for name in _model_summaries(model)})
    return out


def _trajectory_summaries(settings: Settings) -> dict[str, tuple[tuple, str]]:
    out = {"eos_entry_step": ((), "int64"), "diverged": ((), "bool"),
           "diverged_step": ((), "int64"), "final_loss": ((), "float64"),
           "final_eff_lr": ((), "float64")}
    if settings.sharpness_every:
        out.update({"final_sharpness": ((), "float64"), "min_sharpness": ((), "float64"),
                    "sharpness_drop": ((), "float64")})
    return out


def _minibatch_summaries(settings: Settings) -> dict[str, tuple[tuple, str]]:
    return {"final_loss": ((), "float64"), "diverged": ((), "bool"),
            "diverged_step": ((), "int64"), "rho_T2": ((), "float64"), "stable": ((), "bool")}


def grid_points(grid: dict[str, np.ndarray], start: int, stop: int,
                dims: tuple[str, ...] = GRID_DIMS) -> dict[str, np.ndarray]:
    """The grid values (one array per axis of ``dims``) of flat trajectories start..stop-1."""
    shape = tuple(len(grid[d]) for d in dims)
    index = np.unravel_index(np.arange(start, stop), shape)
    return {d: np.asarray(grid[d])[i] for d, i in zip(dims, index)}


def initial_points(model: ScaleInvariantModel, seeds: np.ndarray,
                   norms: np.ndarray) -> np.ndarray:
    """w0 (B, D): the direction of ``model.random_point(seed=s)`` scaled to each norm."""
    directions = {int(s): model.random_point(seed=int(s)) for s in np.unique(seeds)}
    W0 = np.stack([directions[int(s)] for s in seeds])
    return W0 * (norms / np.linalg.norm(W0, axis=1))[:, None]


def run_chunk(model, settings: Settings, pts: dict[str, np.ndarray], start: int):
    """The engine call of one chunk: a Trajectory, or an SGDResult for a minibatch method.

    Parameters
    ----------
    model
        The sweep's model.
    settings : Settings
    pts : dict
        The chunk's grid values, ``grid_points(grid, start, stop, settings.dims)``.
    start : int
        The chunk's first flat trajectory, passed as ``first_trajectory``: the engine
        keys its random streams (jitter, Lanczos starts, SGD batches) by the global
        trajectory index, so a point's numbers do not depend on the chunking.
    """
    W0 = initial_points(model, pts["seed"], pts["init_norm"])
    return settings.chunks.run(model, W0, grid_hyper(settings.spec, pts), method=settings.method,
                               options=settings.run_options(start))


def grid_hyper(spec: MethodSpec, pts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A swept method's hyperparameters from the grid's axes ``pts``: ``lr`` is its step size
    (``eta`` on the sphere), ``wd`` its weight decay (0 for a method without one), any other
    axis (SGD's ``batch``) the hyperparameter of its name."""
    axes = dict(pts, eta=pts["lr"])
    if not set(spec.hyper) <= set(axes) or {"lr", "eta"} <= set(spec.hyper):
        raise ValueError(f"method {spec.name!r} has no grid of {spec.grid_axes[:-2]} "
                         f"(it reads {spec.hyper})")
    return {name: axes[name] for name in spec.hyper}


def compute_chunk(spec: dict, grid: dict[str, np.ndarray], settings: Settings,
                  start: int, stop: int) -> dict[str, np.ndarray]:
    """Run grid points start..stop-1 in one engine call; arrays with a leading (stop - start,)
    axis."""
    model = _spec.cached(spec)
    pts = grid_points(grid, start, stop, settings.dims)
    return settings.chunks.summarise(model, run_chunk(model, settings, pts, start), settings)


def end_sharpness(model: ScaleInvariantModel, w: np.ndarray, lr, wd, *,
                  eff_lr=None) -> np.ndarray:
    """Mean spherical sharpness over the two phases of the period-two oscillation, (B,).

    Parameters
    ----------
    model : ScaleInvariantModel
    w : ndarray, shape (B, D)
        Final iterates w_T.
    lr, wd : float or ndarray, shape (B,)
        Their hyperparameters; without ``eff_lr`` one more GD+WD step gives w_T+1.
    eff_lr : float or ndarray, shape (B,), optional
        The effective LR eta_T of the step from w_T (``Trajectory.eff_lr`` at step T):
        w_T+1 is then the direction of w_T - eta_T ||w_T||^2 grad L(w_T), the
        method's own step on the sphere: projected GD's theta - eta grad L(theta),
        and scalar RMSprop's (1 - lr wd) w - lr grad L(w) / (sqrt(v_T) + eps) up to
        the positive factor 1 - lr wd, which the spherical sharpness ignores.

    Returns
    -------
    ndarray, shape (B,)
        (S(w_T) + S(w_T+1)) / 2. Lanczos is warm-started from the gradient (at EoS it
        lies along the top eigenvector), so no random start enters and each row is
        computed alone: a row's value does not depend on the rest of the batch.
    """
    w = np.atleast_2d(np.asarray(w, dtype=np.float64))
    lr = np.broadcast_to(np.asarray(lr, dtype=np.float64), w.shape[:1])
    wd = np.broadcast_to(np.asarray(wd, dtype=np.float64), w.shape[:1])
    if eff_lr is not None:
        eff_lr = np.broadcast_to(np.asarray(eff_lr, dtype=np.float64), w.shape[:1])
    fallback = np.ones(model.dim) / np.sqrt(model.dim)
    total = np.zeros(w.shape[0])
    point = w
    for _ in range(2):
        grad = model.grad(point)
        start = grad + 1e-3 * np.linalg.norm(grad, axis=1, keepdims=True) * fallback
        start[~np.any(grad != 0, axis=1)] = fallback
        total += spherical_sharpness(model, point, start=start, method="lanczos").eigenvalues[:, 0]
        if eff_lr is None:
            point = (1 - lr * wd)[:, None] * point - lr[:, None] * grad
        else:
            norm2 = np.einsum("ij,ij->i", point, point)
            point = point - (eff_lr * norm2)[:, None] * grad
    return 0.5 * total


def sharpness_drop(model: ScaleInvariantModel, tr, steps: int | None = None) -> np.ndarray:
    """Sharpness lost after EoS entry, (B,); NaN where the edge was never reached or the run
    diverged.

    Neither end may depend on where the sharpness records fall (a quantity that does
    paints lr x wd maps as a checkerboard):

    - the start is the largest sharpness recorded at or before the entry record.
      Before the edge, sharpness only rises to a plateau; right after it, it falls
      within a few hundred steps, so the sharpness *at* the entry record depends on
      how long before that record the edge was crossed, which jumps between 0 and
      ``sharpness_every`` steps from one grid point to the next. A run that enters
      before the first record after step 0 has no such record: NaN (step 0 is the
      start, usually far from the minimisers and their sharpness).
    - the end is the mean of S(w_T) and S(w_T+1), one more step of the run's own
      method (GD+WD, or for projected GD and scalar RMSprop the step of effective LR
      ``tr.eff_lr`` at T, see :func:`end_sharpness`): at EoS the iterate oscillates
      with period two and S differs between the two phases by a few per cent, while
      which phase lands on step T is an accident of each run.
      Lanczos is warm-started from the gradient (at EoS the gradient lies along the
      top eigenvector) so no random start enters and each row is computed alone:
      the value does not depend on the chunk.

    ``steps`` (the run's T) is needed for scalar RMSprop, whose step size at T is read
    from ``tr.eff_lr`` recorded at T.
    """
    sharp = tr.sharpness
    B = sharp.shape[1]
    first = tr.sharpness_steps[1] if len(tr.sharpness_steps) > 1 else np.inf
    entered = (tr.eos_entry_step > first) & ~tr.diverged
    drop = np.full(B, np.nan)
    if not entered.any():
        return drop
    idx = np.flatnonzero(entered)
    at = np.searchsorted(tr.sharpness_steps, tr.eos_entry_step[idx])
    upto = np.arange(len(sharp))[:, None] <= at
    peak = np.max(np.where(upto, sharp[:, idx], -np.inf), axis=0)
    spec = method_spec(tr.method)
    if not (spec.on_sphere or spec.adaptive_step):  # GD+WD: the next step from lr and wd alone
        end = end_sharpness(model, tr.w[idx], tr.lr[idx], tr.wd[idx])
    else:  # pgd: eff_lr is eta; an adaptive step: the sweep makes step T a record step
        if spec.adaptive_step and tr.steps[-1] != steps:
            raise ValueError(f"{tr.method}: the end sharpness needs eff_lr recorded at the "
                             "last step, steps (record_every must divide steps)")
        end = end_sharpness(model, tr.w[idx], tr.lr[idx], tr.wd[idx], eff_lr=tr.eff_lr[-1, idx])
    drop[idx] = peak - end
    return drop


def summarise(model: ScaleInvariantModel, tr, settings: Settings) -> dict[str, np.ndarray]:
    """The chunk's outputs (see ``layout``) from a batched Trajectory."""
    out = {name: np.ascontiguousarray(getattr(tr, name).T) for name, axis in RECORDED.items()
           if axis == "step" or settings.sharpness_every}
    out.update(eos_entry_step=tr.eos_entry_step.astype(np.int64), diverged=tr.diverged,
               diverged_step=tr.diverged_step.astype(np.int64), final_loss=tr.loss[-1].copy(),
               final_eff_lr=tr.eff_lr[-1].copy())
    if settings.sharpness_every:
        sharp = tr.sharpness
        out["final_sharpness"] = sharp[-1].copy()
        finite = np.isfinite(sharp)
        out["min_sharpness"] = np.where(finite.any(axis=0),
                                        np.min(np.where(finite, sharp, np.inf), axis=0), np.nan)
        out["sharpness_drop"] = sharpness_drop(model, tr, settings.steps)
    return out | _model_summary_values(model, tr.w, tr.diverged)


def summarise_minibatch(model, res, settings: Settings) -> dict[str, np.ndarray]:
    """The outputs of an SGD chunk (see ``layout``) from a batched ``SGDResult``.

    ``rho_T2`` is computed row by row, each from its own final iterate, lr and batch
    (``pysharp.stability.second_moment_operator``, the sampling scheme of the run), so
    a row's value does not depend on the rest of the chunk.
    """
    rho = np.full(len(res.diverged), np.nan)
    for j in np.flatnonzero(~res.diverged):
        rho[j] = second_moment_operator(model, res.w[j], float(res.lr[j]), int(res.batch[j]),
                                        replacement=res.replacement).spectral_radius
    out = {"loss": np.ascontiguousarray(res.loss.T), "final_loss": res.loss[-1].copy(),
           "diverged": res.diverged.copy(), "diverged_step": res.diverged_step.astype(np.int64),
           "rho_T2": rho, "stable": np.asarray(rho <= 1 + STABLE_RTOL)}
    return out | _model_summary_values(model, res.w, res.diverged)


def _model_summary_values(model, w: np.ndarray, diverged: np.ndarray) -> dict[str, np.ndarray]:
    """The registry's summaries of the final iterates ``w`` (B, D); NaN where diverged."""
    out = {}
    for name, summary in _model_summaries(model).items():
        values = np.full(len(diverged), np.nan)
        alive = ~diverged
        if alive.any():
            values[alive] = summary.compute(model, w[alive])
        out[name] = values
    return out


@dataclass(frozen=True)
class Chunks:
    """How a sweep runs and summarises the chunks of one engine (a row's ``engine``).

    Attributes
    ----------
    run : callable
        The engine's runner, ``run(model, W0, hyper, method=..., options=RunOptions)``
        (its ``Engine.runner``).
    recorded : dict
        Its recorded metrics: name -> record axis.
    summary_doc : dict
        Descriptions of its per-trajectory summaries.
    summaries : callable
        ``summaries(settings)``: those summaries' layout, name -> ((), dtype).
    summarise : callable
        ``summarise(model, result, settings)``: a chunk's outputs from the runner's result.
    """

    run: Callable
    recorded: dict[str, str]
    summary_doc: dict[str, str]
    summaries: Callable[[Settings], dict]
    summarise: Callable


#: The sweep's side of each engine of the method table, by ``MethodSpec.engine``.
CHUNKS = {
    "trajectory": Chunks(run_method, RECORDED, SUMMARY_DOC, _trajectory_summaries, summarise),
    "minibatch": Chunks(run_minibatch, SGD_RECORDED, SGD_SUMMARY_DOC, _minibatch_summaries,
                        summarise_minibatch),
}
