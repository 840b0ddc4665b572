"""One sweep chunk: a contiguous block of grid points, run as one engine call.

``compute_chunk`` is what an executor runs; it takes and returns plain data
(a spec, the grid, numbers, NumPy arrays), so it pickles to any process or
machine. Everything here is deterministic: a chunk computed anywhere, in any
order, gives the same bytes, because the engine keys its random streams by
the global trajectory index (``first_trajectory``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dynamics import run_gd_wd
from ..models import ScaleInvariantModel
from ..models._registry import entry_of
from . import _spec

#: Grid dimensions, in the order of the Dataset's axes (trajectories are laid
#: out flat in this C order).
GRID_DIMS = ("lr", "wd", "seed", "init_norm")

#: Recorded metrics: name -> record axis.
RECORDED = {"loss": "step", "norm2": "step", "eff_lr": "step",
            "sharpness": "sharpness_step", "eos_ratio": "sharpness_step"}

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


def summary_doc(model: ScaleInvariantModel) -> dict[str, str]:
    """Descriptions of every summary variable of a sweep of ``model``."""
    return SUMMARY_DOC | {name: s.doc for name, s in _model_summaries(model).items()}


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

    def record_steps(self) -> dict[str, np.ndarray]:
        steps = np.arange(0, self.steps + 1, self.record_every)
        sharp = (np.arange(0, self.steps + 1, self.sharpness_every) if self.sharpness_every
                 else np.zeros(0, dtype=np.int64))
        return {"step": steps, "sharpness_step": sharp}


def layout(model: ScaleInvariantModel, settings: Settings) -> dict[str, tuple[tuple, str]]:
    """Per-trajectory outputs of a chunk: name -> (shape after the trajectory axis, dtype)."""
    lengths = {k: len(v) for k, v in settings.record_steps().items()}
    out = {name: ((lengths[axis],), "float64") for name, axis in RECORDED.items()
           if lengths[axis] or axis == "step"}
    out.update({"eos_entry_step": ((), "int64"), "diverged": ((), "bool"),
                "diverged_step": ((), "int64"), "final_loss": ((), "float64"),
                "final_eff_lr": ((), "float64")})
    if settings.sharpness_every:
        out.update({"final_sharpness": ((), "float64"), "min_sharpness": ((), "float64"),
                    "sharpness_drop": ((), "float64")})
    out.update({name: ((), "float64") for name in _model_summaries(model)})
    return out


def grid_points(grid: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """The (lr, wd, seed, init_norm) values of flat trajectories start..stop-1."""
    shape = tuple(len(grid[d]) for d in GRID_DIMS)
    index = np.unravel_index(np.arange(start, stop), shape)
    return {d: np.asarray(grid[d])[i] for d, i in zip(GRID_DIMS, index)}


def initial_points(model: ScaleInvariantModel, seeds: np.ndarray,
                   norms: np.ndarray) -> np.ndarray:
    """w0 (B, D): the direction of ``model.random_point(seed=s)`` scaled to each norm."""
    directions = {int(s): model.random_point(seed=int(s)) for s in np.unique(seeds)}
    W0 = np.stack([directions[int(s)] for s in seeds])
    return W0 * (norms / np.linalg.norm(W0, axis=1))[:, None]


def compute_chunk(spec: dict, grid: dict[str, np.ndarray], settings: Settings,
                  start: int, stop: int) -> dict[str, np.ndarray]:
    """Run grid points start..stop-1 in one engine call; arrays with a leading (stop - start,)
    axis."""
    model = _spec.cached(spec)
    pts = grid_points(grid, start, stop)
    W0 = initial_points(model, pts["seed"], pts["init_norm"])
    tr = run_gd_wd(model, W0, pts["lr"], pts["wd"], settings.steps,
                   record_every=settings.record_every, sharpness_every=settings.sharpness_every,
                   jitter=settings.jitter, seed=0, backend=settings.backend,
                   eos_tol=settings.eos_tol, first_trajectory=start)
    return summarise(model, tr, settings)


def end_sharpness(model: ScaleInvariantModel, w: np.ndarray, lr, wd) -> np.ndarray:
    """Mean spherical sharpness over the two phases of the period-two oscillation, (B,).

    Parameters
    ----------
    model : ScaleInvariantModel
    w : ndarray, shape (B, D)
        Final iterates w_T.
    lr, wd : float or ndarray, shape (B,)
        Their hyperparameters; one more GD+WD step gives w_T+1.

    Returns
    -------
    ndarray, shape (B,)
        (S(w_T) + S(w_T+1)) / 2. Lanczos is warm-started from the gradient (at EoS it
        lies along the top eigenvector), so no random start enters and each row is
        computed alone: a row's value does not depend on the rest of the batch.
    """
    from ..sharpness import spherical_sharpness
    w = np.atleast_2d(np.asarray(w, dtype=np.float64))
    lr = np.broadcast_to(np.asarray(lr, dtype=np.float64), w.shape[:1])
    wd = np.broadcast_to(np.asarray(wd, dtype=np.float64), w.shape[:1])
    fallback = np.ones(model.dim) / np.sqrt(model.dim)
    total = np.zeros(w.shape[0])
    point = w
    for _ in range(2):
        grad = model.grad(point)
        start = grad + 1e-3 * np.linalg.norm(grad, axis=1, keepdims=True) * fallback
        start[~np.any(grad != 0, axis=1)] = fallback
        total += spherical_sharpness(model, point, start=start, method="lanczos").eigenvalues[:, 0]
        point = (1 - lr * wd)[:, None] * point - lr[:, None] * grad
    return 0.5 * total


def sharpness_drop(model: ScaleInvariantModel, tr) -> np.ndarray:
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
    - the end is the mean of S(w_T) and S(w_T+1), one more GD+WD step: at EoS the
      iterate oscillates with period two and S differs between the two phases by a
      few per cent, while which phase lands on step T is an accident of each run.
      Lanczos is warm-started from the gradient (at EoS the gradient lies along the
      top eigenvector) so no random start enters and each row is computed alone:
      the value does not depend on the chunk.
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
    end = end_sharpness(model, tr.w[idx], tr.lr[idx], tr.wd[idx])
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
        out["sharpness_drop"] = sharpness_drop(model, tr)
    for name, summary in _model_summaries(model).items():
        values = np.full(len(tr.diverged), np.nan)
        alive = ~tr.diverged
        if alive.any():
            values[alive] = summary.compute(model, tr.w[alive])
        out[name] = values
    return out
