"""Ablation: without weight decay there is no EoS, and sharpness and test loss stop improving."""

from __future__ import annotations

from .. import BNLinearRegression, BNMatrixCompletion, run_gd_wd
from ..theory import min_norm_interpolant
from . import plt
from ._common import cosine

DESCRIPTION = ("The same runs with wd > 0 and wd = 0: matrix completion (sharpness, test loss) "
               "and BN linear regression (cosine to the min-norm interpolant).")


def run(out, quick: bool) -> dict:
    steps_mc = 10_000 if quick else 30_000
    steps_lin = 40_000 if quick else 100_000
    mc = BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    lin = BNLinearRegression.synthetic()
    wt = min_norm_interpolant(lin)
    res, summary = {}, {"figures": ["ablation.png"]}
    for wd in (1e-3, 0.0):
        every = steps_mc // 100
        tr = run_gd_wd(mc, mc.random_point(seed=1, norm=5.0), 0.2, wd, steps_mc,
                       record_every=every, sharpness_every=every * 5, theta_every=every)
        res[("mc", wd)] = (tr, mc.test_loss(tr.theta))
    for wd in (2e-4, 0.0):
        every = steps_lin // 200
        tr = run_gd_wd(lin, lin.random_point(seed=0, norm=10.0), 0.5, wd, steps_lin,
                       record_every=every, sharpness_every=every * 5, theta_every=every)
        res[("lin", wd)] = (tr, cosine(tr.theta, wt))

    pyplot = plt()
    fig, ax = pyplot.subplots(1, 3, figsize=(13, 3.8))
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
    ax[0].set(xlabel="step", title="matrix completion: spherical sharpness")
    ax[1].set(xlabel="step", title="matrix completion: test loss")
    ax[2].set(xlabel="step", title="BN linreg: 1 - cosine to min-norm")
    for a in ax:
        a.legend()
    fig.tight_layout()
    fig.savefig(out / "ablation.png", dpi=110)
    pyplot.close(fig)
    return summary
