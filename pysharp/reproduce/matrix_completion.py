"""BN matrix completion: after EoS entry sharpness and test loss fall and low rank emerges."""

from __future__ import annotations

import numpy as np

from .. import BNMatrixCompletion, run_gd_wd
from . import plt

DESCRIPTION = ("20 x 20 rank-2 truth, half the entries observed, rank-20 factors, GD+WD lr 0.2, "
               "wd 1e-3: after EoS entry the spherical sharpness and the held-out loss fall and the "
               "singular values of U V^T beyond the true rank shrink.")


def _singular_values(model, thetas):
    U, V = model.factors(thetas)
    return np.linalg.svd(U @ np.swapaxes(V, -1, -2), compute_uv=False)


def run(out, quick: bool) -> dict:
    lr, wd = 0.2, 1e-3
    steps = 10_000 if quick else 30_000
    model = BNMatrixCompletion.synthetic(size=20, true_rank=2, rank=20, seed=0)
    w0 = model.random_point(seed=1, norm=5.0)
    every = steps // 100
    tr = run_gd_wd(model, w0, lr, wd, steps, record_every=every, sharpness_every=every * 5,
                   theta_every=every)
    test = model.test_loss(tr.theta)
    sv = _singular_values(model, tr.theta)
    sv = sv / sv[:, :1]
    entry = max(int(tr.eos_entry_step), 0)
    k_entry = int(np.searchsorted(tr.theta_steps, entry))
    sh_entry = float(tr.sharpness[np.searchsorted(tr.sharpness_steps, entry)])
    gap_entry = float(sv[k_entry, 2] / sv[k_entry, 1])
    gap_end = float(sv[-1, 2] / sv[-1, 1])

    pyplot = plt()
    fig, ax = pyplot.subplots(1, 3, figsize=(13, 3.8))
    ax[0].plot(tr.sharpness_steps, tr.sharpness, ".-")
    ax[0].set(xlabel="step", title="spherical sharpness")
    ax[1].semilogy(tr.steps, tr.loss, label="train")
    ax[1].semilogy(tr.theta_steps, test, label="test (held out)")
    ax[1].set(xlabel="step", title="loss")
    ax[1].legend()
    for j in range(6):
        ax[2].semilogy(tr.theta_steps, sv[:, j], label=f"sigma_{j + 1}")
    ax[2].set(xlabel="step", title="singular values of U V^T / sigma_1")
    ax[2].legend(fontsize=7, ncol=2)
    for a in ax:
        a.axvline(entry, color="C3", ls=":", lw=0.8)
    fig.tight_layout()
    fig.savefig(out / "matrix_completion.png", dpi=110)
    pyplot.close(fig)
    return {"figures": ["matrix_completion.png"], "lr": lr, "wd": wd, "steps": steps,
            "eos_entry_step": entry, "sharpness_at_entry": sh_entry,
            "sharpness_end": float(tr.sharpness[-1]),
            "test_loss_at_entry": float(test[k_entry]), "test_loss_end": float(test[-1]),
            "sigma3_over_sigma2_at_entry": gap_entry, "sigma3_over_sigma2_end": gap_end,
            "train_loss_end": float(tr.loss[-1])}
