"""Period-two diagnostics of GD+WD at the Edge of Stability (Lyu, Li, Arora 2022).

After EoS entry, the direction theta_t of GD+WD oscillates around its projection
phi_t onto the manifold Gamma of minimisers, along the top Hessian eigenvector:

    h_t = <theta_t - phi_t, v_1(phi_t)>,

flips sign at every step (period two) with |h_t| = O(eta_in^(1/2)),
eta_in = lr * wd. The oscillation drives phi_t along Gamma; over one period,

    phi_{t+2} - phi_t ~ -2 h_t^2 grad_Gamma log lambda_1(phi_t).

Theorem 4.4: at the step where GD+WD reaches the edge, the effective LR is
2 / lambda_1(theta*) + O(eta_in^(1/2)) for the minimiser theta* it approached.
``period_two_diagnostics`` measures all three on a recorded run.

The drift coefficient. Taylor-expanding two projected-GD steps from
theta = phi + h v_1 gives the tangent displacement
-eff_lr * h^2 * grad_Gamma lambda_1 = -2 h^2 grad_Gamma log lambda_1 at
eff_lr = 2 / lambda_1 (the h^2 / 2 terms of grad L(phi + h v_1) of the two
steps add up). The proof sketch of the paper writes -4 h_t^2 together with
a period average 2 h_t^2 ~ 2 eta_in / (4 + |g|^2); with h_t as defined here
(the v_1-component of theta_t - phi_t on the unit sphere) the drift
coefficient is 2 and the period average of h_t^2 twice the paper's:
GD+WD gives phi_{t+2} - phi_t = -2 h_t^2 g_t (norm ratio 0.9987 at
eta_in = 1e-4) and mean h_t^2 (4 + |g_t|^2) ~ 2 eta_in (1.007 and 1.047 of
it over 2000 steps at eta_in = 1e-3, 1e-4). The products agree, and so does
the flow: per step d zeta = -2 eta_in g / (4 + |g|^2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dynamics import Trajectory
from .flow import FlowError, SharpnessReductionFlow
from .models import ScaleInvariantModel
from .models._kinds import require_scale_invariant

#: phi_{t+2} - phi_t is predicted as -DRIFT_COEFFICIENT * h_t^2 * grad_Gamma log lambda_1(phi_t).
DRIFT_COEFFICIENT = 2.0


@dataclass
class PeriodTwoDiagnostics:
    """Period-two oscillation, drift along Gamma and Theorem 4.4 of one GD+WD run.

    Arrays over the window of T consecutive steps (the entry step on):

    ``steps`` (T,) step numbers; ``h`` (T,) the amplitude
    <theta_t - phi_t, v_1(phi_t)> (v_1's sign kept continuous along the
    window); ``phi`` (T, D) the projections onto Gamma; ``sharpness`` (T,)
    lambda_1(phi_t); ``log_grad`` (T, D) g_t = grad_Gamma log lambda_1(phi_t);
    ``eff_lr`` (T,) the effective LR at each step; ``drift_measured``
    (T - 2, D) phi_{t+2} - phi_t and ``drift_predicted`` (T - 2, D)
    -2 h_t^2 g_t (see ``DRIFT_COEFFICIENT``).

    Summaries: ``eta_in`` lr * wd; ``amplitude_ratio`` max |h| / sqrt(eta_in)
    (theory: O(1)); ``sign_alternation`` the fraction of consecutive steps
    with h_t h_{t+1} < 0 (theory: 1, except where |h_t| dips to the rounding
    or jitter level in the troughs of the oscillation's slow cycle);
    ``drift_cosine`` and ``drift_ratio``: <M, P> / (|M| |P|) and |M| / |P|
    for M = ``drift_measured``, P = ``drift_predicted`` as (T - 2) x D
    arrays (Frobenius), so the steps with large oscillation weigh most
    (theory: both 1 + O(eta_in^(1/2))); ``h2_flow_ratio``
    mean h_t^2 (4 + |g_t|^2) / (2 eta_in), which makes the mean drift that of
    the flow when it is 1 (meaningful over whole slow cycles of |h_t|).

    Theorem 4.4: ``eos_entry_step`` is the engine's entry (eos_ratio first
    >= 2 (1 - eos_tol)); ``entry_step`` the first maximum of the effective LR
    from there on, where the oscillation first halts its growth: the run is
    at the edge. ``phi_entry`` (D,) is theta*, ``lambda1_entry``
    lambda_1(theta*), ``eff_lr_entry`` the effective LR at ``entry_step`` and
    ``entry_ratio`` eff_lr_entry * lambda1_entry / 2 (theory:
    1 + O(eta_in^(1/2)), up to a log factor of the initial perturbation).
    """

    steps: np.ndarray
    h: np.ndarray
    phi: np.ndarray = field(repr=False)
    sharpness: np.ndarray = field(repr=False)
    log_grad: np.ndarray = field(repr=False)
    eff_lr: np.ndarray = field(repr=False)
    drift_measured: np.ndarray = field(repr=False)
    drift_predicted: np.ndarray = field(repr=False)
    eta_in: float
    amplitude_ratio: float
    sign_alternation: float
    drift_cosine: float
    drift_ratio: float
    h2_flow_ratio: float
    eos_entry_step: int
    entry_step: int
    phi_entry: np.ndarray = field(repr=False)
    lambda1_entry: float
    eff_lr_entry: float
    entry_ratio: float

    def summary(self) -> dict:
        """The scalar fields as a plain dict (JSON-ready)."""
        keys = ("eta_in", "amplitude_ratio", "sign_alternation", "drift_cosine", "drift_ratio",
                "h2_flow_ratio", "eos_entry_step", "entry_step", "lambda1_entry",
                "eff_lr_entry", "entry_ratio")
        out = {k: getattr(self, k) for k in keys}
        out["window"] = [int(self.steps[0]), int(self.steps[-1])]
        return out


def _single(values, name: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim == 0:
        return a
    if a.size != 1:
        raise ValueError(f"trajectory holds {a.size} trajectories ({name} has shape {a.shape}): "
                         "pass a single-trajectory run")
    return a.reshape(())


def _check(model, trajectory, window, flow):
    require_scale_invariant(model, "period_two_diagnostics",
                            "the diagnostics follow GD+WD on a scale-invariant loss")
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory must be a pysharp Trajectory, got "
                        f"{type(trajectory).__name__}")
    if trajectory.method != "gd_wd":
        raise ValueError(f"trajectory must come from run_gd_wd, got method {trajectory.method!r}")
    if flow is None:
        flow = SharpnessReductionFlow(model)
    elif not isinstance(flow, SharpnessReductionFlow):
        raise TypeError(f"flow must be a SharpnessReductionFlow, got {type(flow).__name__}")
    elif flow.model is not model:
        raise ValueError("flow must be built on the same model object as model")
    if trajectory.theta is None:
        raise ValueError("the trajectory has no theta snapshots: run run_gd_wd with theta_every=1")
    theta = np.asarray(trajectory.theta, dtype=np.float64)
    if theta.ndim == 3:
        if theta.shape[1] != 1:
            raise ValueError(f"trajectory holds {theta.shape[1]} trajectories: pass a "
                             "single-trajectory run")
        theta = theta[:, 0]
    if theta.shape[-1] != model.dim:
        raise ValueError(f"trajectory has dimension {theta.shape[-1]}, model {model.dim}")
    if len(trajectory.theta_steps) < 2 or np.any(np.diff(trajectory.theta_steps) != 1):
        raise ValueError("period-two diagnostics need a snapshot at every step: run run_gd_wd "
                         "with theta_every=1")
    steps = np.asarray(trajectory.steps)
    if (len(steps) != len(trajectory.theta_steps)
            or np.any(steps != trajectory.theta_steps)):
        raise ValueError("period-two diagnostics need the effective LR at every step: run "
                         "run_gd_wd with record_every=1 (and theta_every=1)")
    if bool(_single(trajectory.diverged, "diverged")):
        step = int(_single(trajectory.diverged_step, "diverged_step"))
        raise ValueError(f"the run diverged at step {step}: nothing to diagnose")
    entry = int(_single(trajectory.eos_entry_step, "eos_entry_step"))
    if entry < 0:
        raise ValueError("the run never entered EoS (eos_entry_step = -1): run longer, or with "
                         "sharpness_every > 0 so that the entry is detected")
    eta_in = float(_single(trajectory.lr, "lr")) * float(_single(trajectory.wd, "wd"))
    if not eta_in > 0:
        raise ValueError("the run has wd = 0: the EoS oscillation needs weight decay")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 3:
            raise ValueError(f"window must be an int >= 3 (steps from the entry on), got "
                             f"{window!r}")
    return flow, theta, entry, eta_in


def _entry_step(trajectory, entry: int) -> int:
    """First local maximum of the effective LR from just before the engine's entry on."""
    eff = np.asarray(trajectory.eff_lr, dtype=np.float64).reshape(-1)
    sharp_steps = np.asarray(trajectory.sharpness_steps)
    # The ratio crossed 2 (1 - eos_tol) after the previous sharpness step.
    earlier = sharp_steps[sharp_steps < entry]
    start = int(earlier[-1]) if len(earlier) else 0
    falls = np.flatnonzero(np.diff(eff[start:]) < 0)
    if len(falls) == 0:
        raise ValueError("the effective LR is still rising at the end of the run: GD+WD has not "
                         "reached the edge yet (run more steps)")
    return start + int(falls[0])


def period_two_diagnostics(model: ScaleInvariantModel, trajectory: Trajectory, *,
                           window: int | None = None,
                           flow: SharpnessReductionFlow | None = None) -> PeriodTwoDiagnostics:
    """Measure the period-two oscillation, the drift along Gamma and Theorem 4.4.

    Every snapshot of the window is projected onto Gamma on its own
    (``SharpnessReductionFlow.project``: a gradient flow in the core, then
    Newton steps with dense eigen-decompositions) and its geometry is
    evaluated (``geometry``: one more eigen-decomposition and a third-order
    contraction). For BN linear regression that is 1.8-1.9 ms per step with n = 12
    samples (d = 20 or 36) and 16-18 ms with n = 20 (d = 36): the cost grows with n
    (2-core Xeon, load about 1): meant for windows of a few hundred to a few
    thousand steps and D up to a few hundred, not for sweeps.

    Parameters
    ----------
    model : ScaleInvariantModel
        The model the run was made on.
    trajectory : Trajectory
        One run of ``run_gd_wd(model, w0, lr, wd, steps, record_every=1,
        theta_every=1, sharpness_every=k)`` (unbatched or B = 1), with
        wd > 0, ``sharpness_every`` > 0 fine enough to detect the EoS entry,
        not diverged, and long enough for the effective LR to peak.
    window : int, optional
        Number of steps analysed from the entry step (the first peak of the
        effective LR) on; at least 3. Default: to the end of the run.
    flow : SharpnessReductionFlow, optional
        The flow object to project with (its ``rank_tol``/``gap_tol``);
        default ``SharpnessReductionFlow(model)``.

    Returns
    -------
    PeriodTwoDiagnostics
        Arrays over the T steps of the window (``h`` (T,), ``phi`` (T, D),
        ``drift_measured``/``drift_predicted`` (T - 2, D), ...) and the
        summaries ``amplitude_ratio``, ``sign_alternation``,
        ``drift_cosine``, ``drift_ratio``, ``entry_ratio``, ...

    Raises
    ------
    ValueError
        Without theta snapshots at every step (``theta_every=1``) or the
        effective LR at every step (``record_every=1``); for a batched,
        diverged or wd = 0 run; when the run never entered EoS or ended
        before the effective LR peaked; for a bad ``window``.
    FlowError
        When a snapshot cannot be projected onto Gamma, or the top
        eigenvalue on Gamma is degenerate (v_1 undefined).
    """
    flow, theta, eos_entry, eta_in = _check(model, trajectory, window, flow)
    entry = _entry_step(trajectory, eos_entry)
    eff = np.asarray(trajectory.eff_lr, dtype=np.float64).reshape(-1)
    stop = len(theta) if window is None else min(len(theta), entry + int(window))
    if stop - entry < 3:
        raise ValueError(f"only {stop - entry} steps from the entry step {entry} on: run longer "
                         "(the window needs at least 3)")
    steps = np.arange(entry, stop)
    T, D = len(steps), model.dim
    phi, log_grad = np.empty((T, D)), np.empty((T, D))
    h, sharp = np.empty(T), np.empty(T)
    v_prev = None
    for i, t in enumerate(steps):
        p, _ = flow.project(theta[t])
        geo = flow.geometry(p)
        if geo.gap < flow.gap_tol:
            raise FlowError(f"degenerate top eigenvalue on Gamma at step {t} (relative gap "
                            f"{geo.gap:.2e}): v_1 and h_t are undefined")
        v = geo.top_vector
        if v_prev is not None and v @ v_prev < 0:
            v = -v
        v_prev = v
        phi[i], log_grad[i], sharp[i] = p, geo.log_grad, geo.sharpness
        h[i] = (theta[t] - p) @ v
    measured = phi[2:] - phi[:-2]
    predicted = -DRIFT_COEFFICIENT * h[:-2, None] ** 2 * log_grad[:-2]
    norm_m, norm_p = float(np.linalg.norm(measured)), float(np.linalg.norm(predicted))
    both = norm_m * norm_p
    cosine = float(np.sum(measured * predicted) / both) if both > 0 else float("nan")
    ratio = norm_m / norm_p if norm_p > 0 else float("nan")
    g2 = np.sum(log_grad ** 2, axis=1)
    lam_entry = float(sharp[0])
    return PeriodTwoDiagnostics(
        steps=steps, h=h, phi=phi, sharpness=sharp, log_grad=log_grad, eff_lr=eff[steps],
        drift_measured=measured, drift_predicted=predicted, eta_in=eta_in,
        amplitude_ratio=float(np.max(np.abs(h)) / np.sqrt(eta_in)),
        sign_alternation=float(np.mean(h[1:] * h[:-1] < 0)),
        drift_cosine=cosine, drift_ratio=ratio,
        h2_flow_ratio=float(np.mean(h ** 2 * (4 + g2)) / (2 * eta_in)),
        eos_entry_step=eos_entry, entry_step=entry, phi_entry=phi[0].copy(),
        lambda1_entry=lam_entry, eff_lr_entry=float(eff[entry]),
        entry_ratio=float(eff[entry] * lam_entry / 2))
