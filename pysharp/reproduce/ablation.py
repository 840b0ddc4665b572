"""Ablation: without weight decay there is no EoS, and sharpness and test loss stop improving."""

from __future__ import annotations

from .. import BNLinearRegression, BNMatrixCompletion, run_gd_wd
from ..theory import min_norm_interpolant
from ._common import cosine, save, subplots

DESCRIPTION = ("The same runs with wd > 0 and wd = 0: matrix completion (sharpness, test loss) "
               "and BN linear regression (cosine to the min-norm interpolant).")


def run(out, quick: bool) -> dict:
    steps_mc = 10_000 if quick else 30_000
    steps_lin = 40_000 if quick else 100_000
    mc = BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    lin = BNLinearRegression.synthetic()
    wt = min_norm_interpolant(lin)
    res, summary = {}, {}
    for wd in (1e-3, 0.0):
        every = steps_mc // 600  # 50 steps in the default run: curves, not segments
        tr = run_gd_wd(mc, mc.random_point(seed=1, norm=5.0), 0.2, wd, steps_mc,
                       record_every=every, sharpness_every=every * 5, theta_every=every)
        res[("mc", wd)] = (tr, mc.test_loss(tr.theta))
    for wd in (2e-4, 0.0):
        every = steps_lin // 1000
        tr = run_gd_wd(lin, lin.random_point(seed=0, norm=10.0), 0.5, wd, steps_lin,
                       record_every=every, sharpness_every=every * 5, theta_every=every)
        res[("lin", wd)] = (tr, cosine(tr.theta, wt))

    fig, ax = subplots(1, 3, figsize=(13, 4.4))
    for wd, style in ((1e-3, "-"), (0.0, "--")):
        tr, test = res[("mc", wd)]
        ax[0].plot(tr.sharpness_steps, tr.sharpness, style, label=f"wd = {wd:g}")
        ax[1].semilogy(tr.theta_steps, test, style, label=f"wd = {wd:g}")
        summary[f"mc_sharpness_end_wd_{wd:g}"] = float(tr.sharpness[-1])
        summary[f"mc_test_loss_end_wd_{wd:g}"] = float(test[-1])
    for wd, style in ((2e-4, "-"), (0.0, "--")):
        tr, cos = res[("lin", wd)]
        ax[2].semilogy(tr.theta_steps, 1 - cos, style, label=f"wd = {wd:g}")
        summary[f"bn_linreg_cosine_end_wd_{wd:g}"] = float(cos[-1])
    ax[0].set(xlabel="step", ylabel="spherical sharpness lambda_1",
              title="matrix completion: sharpness")
    ax[1].set(xlabel="step", ylabel="held-out MSE", title="matrix completion: test loss")
    ax[2].set(xlabel="step", ylabel="1 - cosine to the min-norm interpolant",
              title="BN lin. reg.: implicit bias")
    for a in ax:
        a.legend()
    settings = {"matrix completion": "BNMatrixCompletion(20 x 20, true rank 2), lr 0.2, "
                                     f"wd 1e-3 and 0, steps {steps_mc}",
                "BN lin. reg.": f"BNLinearRegression(d={lin.dim}, n={lin.n}), lr 0.5, "
                                f"wd 2e-4 and 0, steps {steps_lin}"}
    figure = save(fig, out, "ablation", "Ablation: with weight decay (solid) and without "
                  "(dashed)", settings)
    return {"figures": [figure], "settings": settings, "steps_mc": steps_mc,
            "steps_bn_linreg": steps_lin, **summary}
