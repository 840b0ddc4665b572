"""GD+WD at the Edge of Stability, its central flow and the sharpness-reduction flow."""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, run_gd_wd
from ..central_flow import CentralFlow, central_start, compare_to_central
from ..flow import SharpnessReductionFlow
from ._common import log_ticks, save, subplots

DESCRIPTION = ("BN linear regression (d 20, n 12, lr 0.5, wd 1e-3): GD+WD from a random start; "
               "400 steps after its EoS entry the central flow starts from the mean point "
               "(w_{t-1} + 2 w_t + w_{t+1}) / 4 of the iterates. Its predicted loss and ||w||^2 "
               "(order 1, and order 2 with the period-two fourth-order terms) against GD+WD's "
               "200-step averages, the edge it keeps, and its direction against the "
               "sharpness-reduction flow (the slow limit).")

#: Averaging window of GD+WD's loss and ||w||^2 (whole period-two cycles).
WINDOW = 200
#: The start's transient: the flow starts 400 steps after entry, where the oscillation
#: is still settling; its averages are compared from this many steps after the start
#: ("settled") and, separately, from 500 steps up to there ("transient").
SETTLE = {False: 3000, True: 1000}


def run(out, quick: bool) -> dict:
    lr, wd, d, n = 0.5, 1e-3, 20, 12
    steps = 1500 if quick else 8000
    settle = SETTLE[quick]
    model = BNLinearRegression.synthetic(d=d, n=n, seed=0)
    w0 = model.random_point(seed=1, norm=3.0)
    pre = run_gd_wd(model, w0, lr, wd, 4000, record_every=100, sharpness_every=50)
    t0 = int(pre.eos_entry_step) + 400
    tr = run_gd_wd(model, w0, lr, wd, t0 + steps + 100, record_every=1, sharpness_every=10,
                   theta_every=10)
    start = run_gd_wd(model, w0, lr, wd, t0 + 1, record_every=1, sharpness_every=0,
                      theta_every=1)
    w_start = central_start(start, t0)
    cf = CentralFlow(model, "gd_wd", lr=lr, wd=wd, k_max=2)
    sol = cf.integrate(w_start, steps, record_every=10)
    cmp = compare_to_central(tr, sol, t0=t0, window=WINDOW)
    sol2 = CentralFlow(model, "gd_wd", lr=lr, wd=wd, k_max=1, order=2).integrate(
        w_start, steps, record_every=10)
    cmp2 = compare_to_central(tr, sol2, t0=t0, window=WINDOW)
    settled = cmp.steps >= t0 + settle
    transient = (cmp.steps >= t0 + 500) & ~settled
    first = cmp.steps < t0 + 500
    on_edge = sol.t >= 50
    flow = SharpnessReductionFlow(model)
    zeta0, _ = flow.project(w_start)
    sr = flow.integrate(zeta0, lr * wd * steps, project_start=False)
    theta = sol.w / np.linalg.norm(sol.w, axis=1, keepdims=True)
    sr_err = np.linalg.norm(theta - sr.sol(lr * wd * sol.t), axis=1)
    keep = (tr.theta_steps >= t0) & (tr.theta_steps <= t0 + steps)
    gd_tau = lr * wd * (tr.theta_steps[keep] - t0)
    gd_err = np.linalg.norm(tr.theta[keep] - sr.sol(gd_tau), axis=1)
    steps_axis = t0 + sol.t

    def worst(errors, mask):
        return float(np.max(errors[mask])) if mask.any() else float("nan")

    err = {"loss_avg_rel_err_max_settled": worst(cmp.loss_rel_error, settled),
           "norm2_avg_rel_err_max_settled": worst(cmp.norm2_rel_error, settled),
           "loss_avg_rel_err_max_settled_order2": worst(cmp2.loss_rel_error, settled),
           "norm2_avg_rel_err_max_settled_order2": worst(cmp2.norm2_rel_error, settled),
           "loss_avg_rel_err_max_transient": worst(cmp.loss_rel_error, transient),
           "loss_avg_rel_err_max_transient_order2": worst(cmp2.loss_rel_error, transient),
           "loss_avg_rel_err_max_first_500": worst(cmp.loss_rel_error, first)}
    edge = float(np.max(np.abs(sol.sharpness[on_edge, 0] - 2)))
    settings = {"model": f"BNLinearRegression(d={d}, n={n})", "lr": lr, "wd": wd,
                "flow start step": t0, "flow steps": steps, "average window": WINDOW}

    fig, axes = subplots(2, 2, figsize=(12, 8))
    ax = axes[0, 0]
    ax.semilogy(tr.steps, tr.loss, color="0.85", lw=0.4, label="GD+WD loss (per step)")
    ax.semilogy(cmp.steps, cmp.loss_avg, "k-", label=f"GD+WD, {WINDOW}-step average")
    ax.semilogy(steps_axis, sol.loss_pred, "r--", label="central flow: predicted average")
    ax.semilogy(steps_axis, sol2.loss_pred, "g:", lw=2, label="order 2: predicted average")
    ax.semilogy(steps_axis, sol.loss, "b-", lw=0.8, label="central flow: L(w(t))")
    # The per-step loss touches 1e-10 in the troughs of the oscillation: the panel's
    # scale is the averages' and L(w(t))'s, so the averages stay readable.
    shown = np.concatenate([cmp.loss_avg, sol.loss[sol.t >= 100]])
    ax.set(xlabel="step", ylabel="training loss", xlim=(t0 - 200, t0 + steps),
           ylim=(0.5 * shown.min(), 3 * shown.max()),
           title="loss: GD+WD's averages and the flow's prediction")
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[0, 1]
    for c, style, name in ((cmp, "-", "order 1"), (cmp2, ":", "order 2")):
        ax.semilogy(c.steps, c.loss_rel_error, "C3" + style, label=f"loss, {name}")
        ax.semilogy(c.steps, c.norm2_rel_error, "C0" + style, label=f"||w||^2, {name}")
    ax.axvspan(t0 + settle, t0 + steps, color="0.93", zorder=0,
               label=f"settled (from {settle} steps after the start)")
    ax.set(xlabel="step", ylabel=f"|{WINDOW}-step average - flow| / average",
           xlim=(t0, t0 + steps),
           title=f"{WINDOW}-step average vs flow, max rel. err over the settled window:\n"
                 f"loss {err['loss_avg_rel_err_max_settled']:.1e} "
                 f"(order 2: {err['loss_avg_rel_err_max_settled_order2']:.1e}), "
                 f"||w||^2 {err['norm2_avg_rel_err_max_settled']:.1e} "
                 f"(order 2: {err['norm2_avg_rel_err_max_settled_order2']:.1e})")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[1, 0]
    ax.plot(tr.sharpness_steps, tr.eos_ratio, ".", ms=2, color="0.6", label="GD+WD")
    ax.plot(steps_axis, sol.sharpness[:, 0], "r-", label="central flow (eta' lambda_1)")
    ax.axhline(2, color="k", lw=0.5)
    ax.set(xlabel="step", ylabel="eff. LR x sharpness", xlim=(0, t0 + steps),
           title=f"the edge: |flow - 2| <= {edge:.0e}")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    ax.semilogy(gd_tau, gd_err, color="0.6", label="GD+WD direction")
    ax.semilogy(lr * wd * sol.t, sr_err, "r-", label="central flow direction")
    ax.set(xlabel="tau = lr wd (t - flow start)",
           ylabel="distance to the sharpness-reduction flow", title="slow limit")
    log_ticks(ax)
    ax.legend(fontsize=7)
    figure = save(fig, out, "central-flow", "GD+WD at EoS, its central flow and the "
                  "sharpness-reduction flow", settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "d": d, "n": n, "lr": lr, "wd": wd, "steps": steps,
            "gd_eos_entry_step": int(tr.eos_entry_step), "flow_start_step": t0,
            "flow_success": sol.success, "flow_integrator_steps": sol.n_steps,
            "average_window_steps": WINDOW,
            "measured": (f"max over the flow's records of |{WINDOW}-step average of GD+WD - "
                         "flow's predicted average| / average; settled: records from "
                         "settled_from_step on, transient: from 500 steps after the flow's "
                         "start up to there, first_500: the first 500 steps"),
            "settle_steps": settle, "settled_from_step": t0 + settle, **err,
            "final_order2_central_sharpness": float(sol2.sharpness[-1, 0]),
            "order2_flow_success": sol2.success,
            "max_edge_error": edge,
            "final_oscillation_variance": float(np.trace(sol.X[-1])),
            "final_distance_to_sr_flow": float(sr_err[-1]),
            "final_gd_distance_to_sr_flow": float(gd_err[-1]),
            "distance_travelled": float(np.linalg.norm(theta[-1] - theta[0]))}
