"""BN linear regression: GD+WD at EoS and the flow converge to the min-norm interpolant."""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, run_gd_wd
from ..flow import SharpnessReductionFlow
from ..theory import min_norm_interpolant
from ._common import cosine, save, subplots

DESCRIPTION = ("Cosine between the direction of w and the min-norm interpolant "
               "pinv(Xc)(y - mean y): GD+WD (lr 0.5, wd 2e-4) and the sharpness-reduction flow "
               "go to 1; GD without weight decay (no EoS) stays at the interpolant it lands on.")


def run(out, quick: bool) -> dict:
    lr, wd = 0.5, 2e-4
    steps = 40_000 if quick else 150_000
    model = BNLinearRegression.synthetic()
    wt = min_norm_interpolant(model)
    w0 = model.random_point(seed=0, norm=10.0)
    # 1500 records (every 100 steps in the default run): the curves and the EoS entry
    # are resolved to 100 steps.
    every = steps // 1500
    gd = run_gd_wd(model, w0, lr, wd, steps, record_every=every, sharpness_every=every,
                   theta_every=every)
    plain = run_gd_wd(model, w0, lr, 0.0, steps, record_every=every, sharpness_every=0,
                      theta_every=every)
    entry = max(int(gd.eos_entry_step), 0)
    flow = SharpnessReductionFlow(model)
    k = int(np.searchsorted(gd.theta_steps, entry))
    sol = flow.integrate(gd.theta[k], lr * wd * (steps - entry))
    cos_gd, cos_plain = cosine(gd.theta, wt), cosine(plain.theta, wt)
    cos_flow = cosine(sol.zeta, wt)
    flow_steps = entry + sol.tau / (lr * wd)

    fig, ax = subplots(1, 2, figsize=(11, 4.4))
    ax[0].plot(gd.theta_steps, 1 - cos_gd, label="GD+WD (EoS)")
    ax[0].plot(flow_steps, 1 - cos_flow, "k--", label="flow from EoS entry")
    ax[0].plot(plain.theta_steps, 1 - cos_plain, label="GD, wd = 0 (no EoS)")
    ax[0].set_yscale("log")
    ax[0].axvline(entry, color="C3", ls=":", lw=0.8, label=f"EoS entry (step {entry})")
    ax[0].set(xlabel="step", ylabel="1 - cosine to min-norm interpolant",
              title="implicit bias towards the min-norm interpolant")
    ax[0].legend()
    ax[1].plot(gd.sharpness_steps, gd.sharpness, label="GD+WD")
    ax[1].plot(flow_steps, sol.sharpness, "k--", label="flow")
    ax[1].set(xlabel="step", ylabel="spherical sharpness lambda_1", title="spherical sharpness")
    ax[1].legend()
    settings = {"model": f"BNLinearRegression(d={model.dim}, n={model.n})", "lr": lr, "wd": wd,
                "steps": steps, "init": "random, ||w0|| = 10"}
    figure = save(fig, out, "bn-linreg-minnorm", "BN linear regression: GD+WD at EoS goes to "
                  "the min-norm interpolant, GD without WD does not", settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": lr, "wd": wd, "steps": steps,
            "eos_entry_step": entry, "record_every": every, "cosine_gd_wd": float(cos_gd[-1]),
            "cosine_flow": float(cos_flow[-1]), "cosine_gd_no_wd": float(cos_plain[-1]),
            "flow_success": sol.success}
