"""Tracking error of GD+WD around the sharpness-reduction flow against lr * wd."""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, run_gd_wd
from ..flow import SharpnessReductionFlow, compare_to_flow
from ._common import log_ticks, loglog_slope, save, subplots, theory_start

DESCRIPTION = ("BN linear regression from the theory's initialisation (near Gamma, effective LR "
               "0.98 x 2 / lambda_1): max_t ||theta_t - zeta(lr wd t)|| over tau in [0, 2] shrinks "
               "with lr * wd; theory: O((lr wd)^(1/4)).")


def run(out, quick: bool) -> dict:
    lr, tau_end = 0.5, 2.0
    wds = np.array([1e-3, 3e-4, 1e-4]) if quick else np.array([1e-3, 3e-4, 1e-4, 3e-5, 1e-5])
    model = BNLinearRegression.synthetic()
    flow = SharpnessReductionFlow(model)
    zeta0, _ = flow.project(model.random_point(seed=0))
    sol = flow.integrate(zeta0, tau_end, project_start=False)
    errors, finals = [], []
    for i, wd in enumerate(wds):
        w0 = theory_start(zeta0, sol.sharpness[0], lr, wd, seed=i)
        steps = int(round(tau_end / (lr * wd)))
        tr = run_gd_wd(model, w0, lr, wd, steps, record_every=steps, sharpness_every=0,
                       theta_every=max(1, steps // 400))
        res = compare_to_flow(tr, sol, t_eos=0)
        errors.append(res.max_error)
        finals.append(float(res.error[-1]))
    eta_lam = lr * wds
    slope = loglog_slope(eta_lam, errors)

    fig, ax = subplots(1, 1, figsize=(5.6, 4.6))
    ax.loglog(eta_lam, errors, "o-", label=f"max error (slope {slope:.2f})")
    ax.loglog(eta_lam, finals, "s--", label="error at tau = 2")
    ref = errors[0] * (eta_lam / eta_lam[0]) ** 0.25
    ax.loglog(eta_lam, ref, "k:", label="slope 1/4")
    ax.set(xlabel="lr x wd", ylabel="||theta_t - zeta(tau)||, tau <= 2",
           title="GD+WD tracks the flow")
    log_ticks(ax, "y")
    ax.legend(fontsize=8)
    settings = {"model": f"BNLinearRegression(d={model.dim}, n={model.n})", "lr": lr,
                "wd": ", ".join(f"{w:.0e}" for w in wds), "tau_end": tau_end,
                "steps": "tau_end / (lr wd)"}
    figure = save(fig, out, "tracking", "Tracking error of GD+WD around the flow", settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": lr, "wd": wds.tolist(), "tau_end": tau_end,
            "steps": [int(round(tau_end / (lr * w))) for w in wds],
            "lr_times_wd": eta_lam.tolist(), "max_error": errors, "final_error": finals,
            "fitted_slope": slope, "flow_success": sol.success}
