"""The sharpness-reduction flow on the manifold of minimisers (Lyu, Li, Arora 2022).

On the manifold Gamma of local minimisers on the unit sphere, with intrinsic
time tau = lr * wd * t, GD+WD at the Edge of Stability tracks

    d zeta / d tau = -2 g / (4 + ||g||^2),   g = P_Gamma grad log lambda_1(zeta),

and projected GD with a Quasi-RMSprop scheduler (``pysharp.QuasiRMSprop``, c =
(1 - beta) / lr^2) tracks, in the time tau = t lr^2 / 2,

    d zeta / d tau = -2 g / (4 + (2 / c) ||g||^2)

(GD+WD's scheduler has c = 2 beta ~ 2: the flow above).

where P_Gamma projects onto the tangent space of Gamma (the null space of
H(zeta), orthogonal to zeta) and grad lambda_1 = D^3L(zeta)[v1, v1] for the
unit top eigenvector v1. This module evaluates that field from the models'
exact HVP and third-order kernels and integrates it with an adaptive
Runge-Kutta method that retracts onto Gamma after every step.

The integrator is a Python loop over flow steps, each a handful of dense
eigen-decompositions: meant for D up to a few hundred (the papers' models),
not for sweeps. Sweep GD+WD itself with ``pysharp.run_gd_wd``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._dormand_prince import B4 as _B4
from ._dormand_prince import B5 as _B5
from ._dormand_prince import A as _A
from ._engine.validation import as_batch, as_positive_int, as_real
from .central_flow import (  # noqa: F401 (re-exported: pysharp.flow.CentralFlow)
    CentralFlow,
    CentralFlowSolution,
    compare_to_central,
)
from .dynamics import QuasiRMSprop, run_pgd
from .models import ScaleInvariantModel
from .models._kinds import require_scale_invariant


class FlowError(RuntimeError):
    """The flow left its domain: no minimiser nearby, or a degenerate top eigenvalue."""


@dataclass
class FlowGeometry:
    """Local geometry of Gamma at a point zeta (unit, (D,)).

    ``sharpness`` lambda_1(H(zeta)); ``top_vector`` v1 (D,); ``gap`` the relative
    gap (lambda_1 - lambda_2) / lambda_1; ``rank`` of H(zeta) by the relative
    threshold; ``tangent`` an orthonormal basis (D, dim Gamma) of the tangent
    space; ``log_grad`` g = P_Gamma grad log lambda_1 (D,).
    """

    sharpness: float
    top_vector: np.ndarray
    gap: float
    rank: int
    tangent: np.ndarray
    log_grad: np.ndarray
    weight: float = 1.0

    @property
    def velocity(self) -> np.ndarray:
        """The flow's field -2 g / (4 + weight ||g||^2), (D,) (weight 1: GD+WD's)."""
        g = self.log_grad
        return -2.0 * g / (4.0 + self.weight * (g @ g))


@dataclass
class FlowSolution:
    """Result of ``SharpnessReductionFlow.integrate``.

    ``tau`` (K,), ``zeta`` (K, D) on Gamma, ``sharpness`` lambda_1(zeta) (K,),
    ``grad_norm`` ||g|| (K,), ``rank`` (K,), ``success``, ``message``, and
    ``sol(tau)`` for dense output (cubic Hermite between accepted steps,
    renormalised onto the sphere; between steps it may leave Gamma by
    O(step^4)).
    """

    tau: np.ndarray
    zeta: np.ndarray
    sharpness: np.ndarray
    grad_norm: np.ndarray
    rank: np.ndarray
    success: bool
    message: str
    velocity: np.ndarray = field(repr=False)

    def sol(self, tau) -> np.ndarray:
        """zeta at times ``tau`` (scalar or (M,)) within [tau[0], tau[-1]]: (D,) or (M, D)."""
        t = np.atleast_1d(np.asarray(tau, dtype=float))
        if np.any(t < self.tau[0] - 1e-12) or np.any(t > self.tau[-1] + 1e-12):
            raise ValueError(f"tau must lie in [{self.tau[0]}, {self.tau[-1]}]")
        i = np.clip(np.searchsorted(self.tau, t, side="right") - 1, 0, len(self.tau) - 2)
        if len(self.tau) == 1:
            out = np.repeat(self.zeta[:1], len(t), axis=0)
        else:
            h = (self.tau[i + 1] - self.tau[i])[:, None]
            s = (t[:, None] - self.tau[i][:, None]) / h
            y0, y1 = self.zeta[i], self.zeta[i + 1]
            f0, f1 = self.velocity[i], self.velocity[i + 1]
            out = ((2 * s ** 3 - 3 * s ** 2 + 1) * y0 + (s ** 3 - 2 * s ** 2 + s) * h * f0
                   + (-2 * s ** 3 + 3 * s ** 2) * y1 + (s ** 3 - s ** 2) * h * f1)
            out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out[0] if np.ndim(tau) == 0 else out


class SharpnessReductionFlow:
    """The sharpness-reduction flow of a scale-invariant model.

    Parameters
    ----------
    model : ScaleInvariantModel
    rank_tol : float
        Eigenvalues of H(zeta) below rank_tol * lambda_1 count as null: they
        span the tangent space of Gamma (with zeta itself removed).
    gap_tol : float
        A relative top-eigenvalue gap below this makes lambda_1 non-smooth:
        the field is then reported as degenerate (FlowError).
    scheduler : QuasiRMSprop, optional
        The flow that projected GD with this Quasi-RMSprop scheduler tracks:
        weight 2 / c on ||g||^2 in the denominator, time tau = t lr^2 / 2
        (``time_per_step``). Default: GD+WD's flow (weight 1, tau = lr wd t).
    """

    def __init__(self, model: ScaleInvariantModel, *, rank_tol: float = 1e-7,
                 gap_tol: float = 1e-8, scheduler=None) -> None:
        require_scale_invariant(model, "SharpnessReductionFlow",
                                "its flow lives on the unit sphere; CentralFlow(model, 'gd', "
                                "lr=...) follows GD on it")
        self.model = model
        #: coefficient of ||g||^2 in the field's denominator
        self.weight = 1.0
        #: flow time one step tracks (None: lr * wd of the GD+WD run compared)
        self.time_per_step: float | None = None
        if scheduler is not None:
            if not isinstance(scheduler, QuasiRMSprop) or np.ndim(scheduler.lr) != 0:
                raise TypeError("scheduler must be a QuasiRMSprop with a scalar lr")
            self.weight = float(2.0 / scheduler.c)
            self.time_per_step = float(scheduler.flow_time_per_step)
        self.rank_tol = as_real(rank_tol, "rank_tol", minimum=0.0, strict=True)
        self.gap_tol = as_real(gap_tol, "gap_tol", minimum=0.0)

    # -- geometry ---------------------------------------------------------------
    def _unit(self, theta) -> np.ndarray:
        W, single = as_batch(theta, self.model.dim, "theta", dtype=np.float64)
        if not single:
            raise ValueError("theta must be a single point of shape (D,)")
        norm = np.linalg.norm(W[0])
        if norm == 0:
            raise ValueError("theta is the zero vector")
        return W[0] / norm

    def _eigh(self, zeta: np.ndarray):
        H = self.model.hessian(zeta)
        evals, evecs = np.linalg.eigh(0.5 * (H + H.T))
        return evals[::-1], evecs[:, ::-1]

    def geometry(self, zeta, *, check: bool = True) -> FlowGeometry:
        """Top eigenpair, rank, tangent space of Gamma and g at a point of Gamma.

        With ``check``, a point whose gradient is not negligible (not on Gamma)
        raises FlowError: ``project`` it first.
        """
        zeta = self._unit(zeta)
        evals, evecs = self._eigh(zeta)
        lam1 = evals[0]
        if not lam1 > 0:
            raise FlowError(f"lambda_1 = {lam1:.3e} <= 0: not at a minimiser with curvature")
        if check:
            res = float(np.linalg.norm(self.model.grad(zeta)))
            if res > 1e-6 * lam1:
                raise FlowError(f"zeta is not on Gamma (||grad L|| = {res:.3e}); project it first")
        rank = int(np.sum(evals > self.rank_tol * lam1))
        gap = (evals[0] - evals[1]) / lam1 if len(evals) > 1 else 1.0
        v1 = evecs[:, 0]
        null = evecs[:, rank:]
        # Remove zeta (H zeta = -grad L = 0 on Gamma) from the null space.
        null = null - np.outer(zeta, zeta @ null)
        u, s, _ = np.linalg.svd(null, full_matrices=False)
        tangent = u[:, s > 0.5]
        grad_lam = self.model.third(zeta, v1)
        g = tangent @ (tangent.T @ grad_lam) / lam1
        return FlowGeometry(float(lam1), v1, float(gap), rank, tangent, g, self.weight)

    def tangent_projection(self, zeta) -> np.ndarray:
        """The orthogonal projector (D, D) onto the tangent space of Gamma at zeta."""
        T = self.geometry(zeta).tangent
        return T @ T.T

    def project(self, theta, *, tol: float = 1e-12, max_iter: int = 50,
                flow_steps: int = 2000) -> tuple[np.ndarray, float]:
        """Move theta onto Gamma: spherical gradient flow, then Newton polishing.

        The gradient flow is projected GD with effective LR 0.5 / lambda_1
        (stable, well below the edge), run in the core for ``flow_steps`` steps
        unless the Riemannian gradient is already small; Newton steps with the
        pseudo-inverse of H on its range then converge quadratically to a
        nearby minimiser (within O(distance^2) of the gradient-flow limit). When
        they do not (the start was outside Newton's basin, as on BN networks with
        nearly flat directions), the flow runs further, in rounds of
        ``flow_steps`` with lambda_1 measured afresh (up to 10), and Newton again.

        Returns
        -------
        zeta : ndarray, (D,)
            Unit point on Gamma.
        residual : float
            ||grad L(zeta)|| at the end.

        Raises
        ------
        FlowError
            When the gradient does not fall below ``tol`` in ``max_iter`` Newton steps.
        """
        theta = self._unit(theta)
        max_iter = as_positive_int(max_iter, "max_iter")
        flow_steps = as_positive_int(flow_steps, "flow_steps")

        def flow(theta: np.ndarray) -> np.ndarray:
            lam1 = max(float(np.linalg.eigvalsh(self.model.hessian(theta))[-1]), 1e-12)
            tr = run_pgd(self.model, theta, 0.5 / lam1, flow_steps, record_every=flow_steps,
                         sharpness_every=0)
            return tr.w / np.linalg.norm(tr.w)

        def newton(theta: np.ndarray) -> tuple[np.ndarray, float]:
            for _ in range(max_iter):
                g = self.model.grad(theta)
                res = float(np.linalg.norm(g))
                if res <= tol:
                    return theta, res
                evals, evecs = self._eigh(theta)
                keep = evals > self.rank_tol * evals[0]
                V = evecs[:, keep]
                theta = theta - V @ ((V.T @ g) / evals[keep])
                theta /= np.linalg.norm(theta)
            return theta, float(np.linalg.norm(self.model.grad(theta)))

        if np.linalg.norm(self.model.grad(theta)) > 1e-6:
            theta = flow(theta)
        zeta, res = newton(theta)
        for _ in range(10):
            if res <= tol * 1e3:
                return zeta, res
            theta = flow(theta)  # further from the flow's own iterate, not Newton's
            zeta, res = newton(theta)
        raise FlowError(f"projection onto Gamma did not converge: ||grad L|| = {res:.3e}")

    # -- integration ------------------------------------------------------------
    def _field(self, zeta: np.ndarray) -> tuple[np.ndarray, FlowGeometry]:
        # Runge-Kutta stages sit O(h^2) off Gamma: no on-Gamma check there.
        geo = self.geometry(zeta, check=False)
        if geo.gap < self.gap_tol:
            raise FlowError(f"degenerate top eigenvalue (relative gap {geo.gap:.2e}): "
                            "lambda_1 is not differentiable here")
        return geo.velocity, geo

    def integrate(self, zeta0, tau_end: float, *, rtol: float = 1e-9, atol: float = 1e-11,
                  max_step: float = np.inf, first_step: float | None = None,
                  max_steps: int = 100_000, project_start: bool = True,
                  callback: Callable[[float, np.ndarray], None] | None = None) -> FlowSolution:
        """Integrate the flow from zeta0 to tau_end (Dormand-Prince 5(4), retracted).

        Parameters
        ----------
        zeta0 : array_like, (D,)
            Start; projected onto Gamma first unless ``project_start`` is False.
        tau_end : float
            Final intrinsic time (tau = lr * wd * steps), > 0.
        rtol, atol : float
            Local error tolerances of the adaptive step.
        max_step : float
            Largest step in tau.
        max_steps : int
            Give up (success False) after this many accepted steps.
        callback : callable, optional
            Called as callback(tau, zeta) after each accepted step.

        Returns
        -------
        FlowSolution
            On a failure (leaving Gamma, degenerate top eigenvalue) ``success``
            is False, ``message`` says why and the solution holds the steps
            taken so far.
        """
        tau_end = as_real(tau_end, "tau_end", minimum=0.0, strict=True)
        rtol = as_real(rtol, "rtol", minimum=0.0, strict=True)
        atol = as_real(atol, "atol", minimum=0.0, strict=True)
        zeta = self._unit(zeta0)
        if project_start:
            zeta, _ = self.project(zeta)
        geo = self.geometry(zeta)
        f = geo.velocity
        taus, zetas, sharp, gnorm, ranks, vels = [0.0], [zeta], [geo.sharpness], \
            [float(np.linalg.norm(geo.log_grad))], [geo.rank], [f]
        if geo.gap < self.gap_tol:
            return FlowSolution(np.array(taus), np.array(zetas), np.array(sharp), np.array(gnorm),
                                np.array(ranks), False,
                                "at tau = 0: degenerate top eigenvalue "
                                f"(relative gap {geo.gap:.2e})",
                                np.array(vels))
        tau = 0.0
        h = first_step or min(max_step, tau_end, 0.01 / max(np.linalg.norm(f), 1e-12))
        success, message = True, "reached tau_end"
        while tau < tau_end:
            if len(taus) > max_steps:
                success, message = False, f"max_steps = {max_steps} reached at tau = {tau:.6g}"
                break
            h = min(h, tau_end - tau, max_step)
            try:
                k = [f]
                for i in range(1, 6):
                    y = zeta + h * sum(a * kk for a, kk in zip(_A[i], k))
                    k.append(self._field(y)[0])
                y5 = zeta + h * sum(b * kk for b, kk in zip(_B5, k))
                k.append(self._field(y5)[0])
                err = h * sum((b5 - b4) * kk for b5, b4, kk in zip(_B5, _B4, k))
            except FlowError as exc:
                success, message = False, f"at tau = {tau:.6g}: {exc}"
                break
            scale = atol + rtol * np.maximum(np.abs(zeta), np.abs(y5))
            err_norm = float(np.sqrt(np.mean((err / scale) ** 2)))
            if err_norm <= 1.0:
                try:
                    zeta, _ = self.project(y5, flow_steps=50)  # retract onto Gamma
                    f, geo = self._field(zeta)
                except FlowError as exc:
                    success, message = False, f"left Gamma at tau = {tau + h:.6g}: {exc}"
                    break
                tau += h
                taus.append(tau)
                zetas.append(zeta)
                sharp.append(geo.sharpness)
                gnorm.append(float(np.linalg.norm(geo.log_grad)))
                ranks.append(geo.rank)
                vels.append(f)
                if callback is not None:
                    callback(tau, zeta)
            factor = 0.9 * err_norm ** -0.2 if err_norm > 0 else 5.0
            h *= min(5.0, max(0.2, factor))
            if h < 1e-14 * max(1.0, tau):
                success, message = False, f"step size underflow at tau = {tau:.6g}"
                break
        return FlowSolution(np.array(taus), np.array(zetas), np.array(sharp), np.array(gnorm),
                            np.array(ranks), success, message, np.array(vels))


@dataclass
class TrackingResult:
    """||theta_t - zeta(tau_t)|| for the recorded directions of a run.

    ``steps`` (K,), ``tau`` (K,) = (flow time per step) (steps - t_eos): lr wd for
    GD+WD, lr^2 / 2 for a Quasi-RMSprop run; ``error`` (K,).
    """

    steps: np.ndarray
    tau: np.ndarray
    error: np.ndarray

    @property
    def max_error(self) -> float:
        return float(np.max(self.error)) if self.error.size else float("nan")


def compare_to_flow(trajectory, flow: FlowSolution, *, t_eos: int | None = None,
                    index: int = 0) -> TrackingResult:
    """Align a GD+WD run (or a Quasi-RMSprop PGD run) to the flow; measure the tracking error.

    Parameters
    ----------
    trajectory : Trajectory
        A run with ``theta_every`` > 0 (theta snapshots).
    flow : FlowSolution
        The flow started at (the projection of) theta at step ``t_eos``.
    t_eos : int, optional
        The step where tau = 0 (default: the run's EoS entry step, else 0).
    index : int
        Which trajectory of a batched run.

    Returns
    -------
    TrackingResult
        Over the snapshots with 0 <= tau <= flow.tau[-1].
    """
    if trajectory.theta is None:
        raise ValueError("the trajectory has no theta snapshots: run with theta_every > 0")
    theta = trajectory.theta if trajectory.theta.ndim == 2 else trajectory.theta[:, index]
    lr = float(np.ravel(trajectory.lr)[index if np.size(trajectory.lr) > 1 else 0])
    wd = float(np.ravel(trajectory.wd)[index if np.size(trajectory.wd) > 1 else 0])
    if t_eos is None:
        entry = int(np.ravel(trajectory.eos_entry_step)[index if np.size(
            trajectory.eos_entry_step) > 1 else 0])
        t_eos = max(entry, 0)
    steps = np.asarray(trajectory.theta_steps)
    per_step = getattr(trajectory, "meta", {}).get("flow_time_per_step")
    if per_step is None:
        per_step = lr * wd
    else:
        per_step = float(np.ravel(per_step)[index if np.size(per_step) > 1 else 0])
    tau = per_step * (steps - t_eos)
    keep = (tau >= 0) & (tau <= flow.tau[-1])
    zeta = flow.sol(tau[keep])
    error = np.linalg.norm(theta[keep] - zeta, axis=1)
    return TrackingResult(steps[keep], tau[keep], error)
