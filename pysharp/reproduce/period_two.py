"""Period-two oscillation at the edge, its drift along Gamma, and Theorem 4.4."""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, Toy3D, run_gd_wd
from ..flow import SharpnessReductionFlow
from ..period_two import period_two_diagnostics
from ._common import loglog_slope, save, subplots, theory_start

DESCRIPTION = ("GD+WD from the theory's start near Gamma (Toy3D c = 10 and BN linear regression): "
               "h_t = <theta_t - phi_t, v_1> flips sign every step with |h_t| ~ sqrt(lr wd), "
               "phi_{t+2} - phi_t = -2 h_t^2 grad_Gamma log lambda_1, and the effective LR at "
               "the edge is 2 / lambda_1(theta*) (1 + O((lr wd)^(1/2))) (Theorem 4.4).")


def _toy_run(model, eta_in: float, steps: int, lr: float = 0.1):
    phi0 = 1.0
    zeta0 = np.array([np.cos(phi0) / np.sqrt(2), np.cos(phi0) / np.sqrt(2), np.sin(phi0)])
    w0 = theory_start(zeta0, 4 * (1 + model.c * np.sin(phi0) ** 2), lr, eta_in / lr,
                      perturbation=1e-4)
    # Jitter keeps x - y from collapsing to exactly 0 (docs/theory.rst, "The 3-D toy loss").
    return run_gd_wd(model, w0, lr, eta_in / lr, steps, record_every=1, sharpness_every=10,
                     theta_every=1, jitter=1e-9, seed=1)


def _to_peak(eta_in: float) -> int:
    # From eff_lr = 0.98 x 2 / lambda_1 the edge is ~0.01 / eta_in steps away, plus the
    # overshoot while the oscillation grows (~sqrt(log(1/h0) / eta_in) steps).
    return int(0.03 / eta_in + 3.0 / np.sqrt(eta_in)) + 50


def run(out, quick: bool) -> dict:
    toy = Toy3D(10.0)
    flow = SharpnessReductionFlow(toy)
    window = 300 if quick else 2000
    diag_etas = [1e-3, 1e-4] if quick else [1e-3, 1e-4, 1e-5]
    entry_etas = [1e-3, 1e-4] if quick else [1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6]

    diags = {}
    for eta in diag_etas:
        tr = _toy_run(toy, eta, _to_peak(eta) + window)
        diags[eta] = period_two_diagnostics(toy, tr, window=window, flow=flow)
    entry = []
    for eta in entry_etas:
        d = diags.get(eta)
        if d is None:
            d = period_two_diagnostics(toy, _toy_run(toy, eta, _to_peak(eta)), window=3,
                                       flow=flow)
        entry.append(d)
    excess = [d.entry_ratio - 1 for d in entry]
    slope = loglog_slope(entry_etas, excess)

    # BN linear regression (d = 20, n = 12): Gamma of dimension 9, so the drift's direction
    # is tested, not only its size.
    bn = BNLinearRegression.synthetic(d=20, n=12)
    bn_flow = SharpnessReductionFlow(bn)
    zeta0, _ = bn_flow.project(bn.random_point(seed=0))
    lam0 = bn_flow.geometry(zeta0).sharpness
    bn_window = 200 if quick else 1000
    bn_diags = {}
    for eta in (5e-4, 5e-5):
        lr = 0.5
        w0 = theory_start(zeta0, lam0, lr, eta / lr, seed=0)
        tr = run_gd_wd(bn, w0, lr, eta / lr, _to_peak(eta) + bn_window, record_every=1,
                       sharpness_every=10, theta_every=1)
        bn_diags[eta] = period_two_diagnostics(bn, tr, window=bn_window, flow=bn_flow)

    fig, axes = subplots(2, 2, figsize=(12, 9))
    ax = axes[0, 0]
    for i, (eta, d) in enumerate(diags.items()):
        k = d.steps - d.entry_step
        ax.plot(k, d.h / np.sqrt(eta), color=f"C{i}", lw=0.3, alpha=0.6)
        ax.plot(k, np.abs(d.h) / np.sqrt(eta), color=f"C{i}", lw=1.2,
                label=f"lr wd = {eta:.0e}: max |h| / sqrt = {d.amplitude_ratio:.2f}")
    ax.set(xlabel="steps after the edge (first peak of the effective LR)",
           ylabel="h_t / sqrt(lr wd)", title="oscillation along v_1 and its envelope |h_t|")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    d = diags[1e-4]
    sl = slice(0, 40)
    ax.plot(d.steps[sl] - d.entry_step, d.h[sl] / np.sqrt(1e-4), "o-", ms=3, lw=0.8)
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="steps after the edge", ylabel="h_t / sqrt(lr wd)",
           title=f"period two (lr wd = 1e-4): sign flips in {100 * d.sign_alternation:.1f} % "
                 "of steps")
    ax = axes[1, 0]
    for i, (label, dd) in enumerate([("Toy3D, lr wd = 1e-4", diags[1e-4]),
                                     ("BN lin. reg., lr wd = 5e-5", bn_diags[5e-5])]):
        P, M = dd.drift_predicted.ravel(), dd.drift_measured.ravel()
        ax.plot(P, M, ".", ms=2, color=f"C{i}",
                label=f"{label}: cos {dd.drift_cosine:.4f}, ratio {dd.drift_ratio:.4f}")
    lim = np.max(np.abs(axes[1, 0].get_xlim()))
    ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
    ax.ticklabel_format(style="sci", scilimits=(0, 0))
    ax.set(xlabel="predicted -2 h_t^2 g_t (components)",
           ylabel="measured phi_{t+2} - phi_t", title="two-step drift along Gamma")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    ax.loglog(entry_etas, excess, "o-", label=f"Toy3D (slope {slope:.2f})")
    ref = excess[0] * (np.array(entry_etas) / entry_etas[0]) ** 0.5
    ax.loglog(entry_etas, ref, "k:", label="slope 1/2")
    ax.set(xlabel="lr x wd", ylabel="eff_lr * lambda_1(theta*) / 2 - 1",
           title="Theorem 4.4: effective LR at the edge")
    rows = [[f"{e:.0e}", f"{d.entry_ratio:.4f}"] for e, d in zip(entry_etas, entry)]
    ax.table(cellText=rows, colLabels=["lr wd", "entry ratio"], loc="lower right",
             colWidths=[0.18, 0.22], fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    settings = {"Toy3D": "c 10, lr 0.1, lr wd " + " ".join(f"{e:.0e}" for e in entry_etas),
                "BN lin. reg.": "d 20, n 12, lr 0.5, lr wd 5e-4 and 5e-5",
                "start": "theory's, eff. LR 0.98 x 2 / lambda_1", "window": window}
    figure = save(fig, out, "period-two", "Period two at the edge, the drift along Gamma, "
                  "Theorem 4.4", settings)

    # Where h_t fails to flip, |h_t| is at the jitter level (1e-9): the troughs of the
    # slow cycle of the oscillation's amplitude.
    no_flip = [np.abs(d.h[:-1][d.h[1:] * d.h[:-1] >= 0]) for d in diags.values()]
    no_flip_h = max((float(a.max()) for a in no_flip if a.size), default=0.0)

    def pack(ds):
        return {f"{eta:.0e}": d.summary() for eta, d in ds.items()}

    return {"figures": [figure], "settings": settings, "model": "Toy3D(c=10), lr = 0.1",
            "window": window, "toy3d": pack(diags), "bn_linear_regression": pack(bn_diags),
            "entry_lr_times_wd": entry_etas,
            "entry_ratio": [d.entry_ratio for d in entry],
            "entry_step": [d.entry_step for d in entry],
            "entry_excess_slope": slope,
            "amplitude_ratio_max": max(d.amplitude_ratio for d in diags.values()),
            "sign_alternation_min": min(d.sign_alternation for d in diags.values()),
            "max_abs_h_where_no_flip": no_flip_h,
            "drift_cosine_min": min(d.drift_cosine for d in
                                    [*diags.values(), *bn_diags.values()]),
            "drift_ratio_smallest_lr_wd": diags[min(diag_etas)].drift_ratio}
