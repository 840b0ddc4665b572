"""GD+WD at the Edge of Stability, its central flow and the sharpness-reduction flow."""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, run_gd_wd
from ..central_flow import CentralFlow, central_start, compare_to_central
from ..flow import SharpnessReductionFlow
from . import plt

DESCRIPTION = ("BN linear regression (d 20, n 12, lr 0.5, wd 1e-3): GD+WD from a random start; "
               "400 steps after its EoS entry the central flow starts from the mean point "
               "(w_{t-1} + 2 w_t + w_{t+1}) / 4 of the iterates. Its predicted loss and ||w||^2 "
               "(order 1, and order 2 with the period-two fourth-order terms) against GD+WD's "
               "200-step averages, the edge it keeps, and its direction against the "
               "sharpness-reduction flow (the slow limit).")


def run(out, quick: bool) -> dict:
    lr, wd = 0.5, 1e-3
    steps = 1500 if quick else 8000
    model = BNLinearRegression.synthetic(d=20, n=12, seed=0)
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
    cmp = compare_to_central(tr, sol, t0=t0, window=200)
    sol2 = CentralFlow(model, "gd_wd", lr=lr, wd=wd, k_max=1, order=2).integrate(
        w_start, steps, record_every=10)
    cmp2 = compare_to_central(tr, sol2, t0=t0, window=200)
    late = cmp.steps >= t0 + 500
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

    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    ax.semilogy(tr.steps, tr.loss, color="0.8", lw=0.5, label="GD+WD loss")
    ax.semilogy(cmp.steps, cmp.loss_avg, "k-", label="GD+WD, 200-step average")
    ax.semilogy(steps_axis, sol.loss_pred, "r--", label="central flow: predicted average")
    ax.semilogy(steps_axis, sol2.loss_pred, "g:", label="order 2: predicted average")
    ax.semilogy(steps_axis, sol.loss, "b:", label="central flow: L(w(t))")
    ax.set(xlabel="step", ylabel="loss", xlim=(t0 - 200, t0 + steps),
           title=f"loss: max rel. error {np.max(cmp.loss_rel_error[late]):.1e} "
                 f"(order 2: {np.max(cmp2.loss_rel_error[late]):.1e})")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(tr.sharpness_steps, tr.eos_ratio, ".", ms=2, color="0.6", label="GD+WD")
    ax.plot(steps_axis, sol.sharpness[:, 0], "r-", label="central flow (eta' lambda_1)")
    ax.axhline(2, color="k", lw=0.5)
    ax.set(xlabel="step", ylabel="eff_lr x sharpness", xlim=(0, t0 + steps),
           title=f"the edge: |flow - 2| <= {np.max(np.abs(sol.sharpness[on_edge, 0] - 2)):.0e}")
    ax.legend(fontsize=7)
    ax = axes[2]
    ax.semilogy(gd_tau, gd_err, color="0.6", label="GD+WD direction")
    ax.semilogy(lr * wd * sol.t, sr_err, "r-", label="central flow direction")
    ax.set(xlabel="tau = lr wd t", ylabel="distance to the sharpness-reduction flow",
           title="slow limit")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "central-flow.png", dpi=110)
    pyplot.close(fig)
    return {"figures": ["central-flow.png"], "lr": lr, "wd": wd, "steps": steps,
            "gd_eos_entry_step": int(tr.eos_entry_step), "flow_start_step": t0,
            "flow_success": sol.success, "flow_integrator_steps": sol.n_steps,
            "max_loss_rel_error": float(np.max(cmp.loss_rel_error[late])),
            "max_norm2_rel_error": float(np.max(cmp.norm2_rel_error[late])),
            "max_loss_rel_error_order2": float(np.max(cmp2.loss_rel_error[late])),
            "max_norm2_rel_error_order2": float(np.max(cmp2.norm2_rel_error[late])),
            "final_order2_central_sharpness": float(sol2.sharpness[-1, 0]),
            "order2_flow_success": sol2.success,
            "max_edge_error": float(np.max(np.abs(sol.sharpness[on_edge, 0] - 2))),
            "max_loss_rel_error_first_500": float(np.max(cmp.loss_rel_error[~late])),
            "final_oscillation_variance": float(np.trace(sol.X[-1])),
            "final_distance_to_sr_flow": float(sr_err[-1]),
            "final_gd_distance_to_sr_flow": float(gd_err[-1]),
            "distance_travelled": float(np.linalg.norm(theta[-1] - theta[0]))}
