"""Hessian spectral density along a GD+WD run: bulk and outliers before, at and after EoS entry."""

from __future__ import annotations

import numpy as np

from .. import (
    BNLinearRegression,
    hessian_spectrum,
    hessian_trace,
    loss_slice,
    run_gd_wd,
    spectral_density,
)
from ._common import save, subplots

DESCRIPTION = ("BN linear regression in the paper's setting (d 40, n 20, lr 0.5, wd 2e-4): the "
               "spherical Hessian's SLQ density (32 probes x 12 Lanczos steps) at the start, in "
               "the descent, just before, at and after EoS entry, checked against the exact "
               "spectrum: a null bulk of D - (n - 2) zero eigenvalues and n - 2 outliers, "
               "frozen while the effective LR grows, then shrinking together after entry.")


def run(out, quick: bool) -> dict:
    lr, wd = 0.5, 2e-4
    steps = 30_000 if quick else 100_000
    every = 250
    model = BNLinearRegression.synthetic()
    D = model.dim
    w0 = model.random_point(seed=0, norm=10.0)
    tr = run_gd_wd(model, w0, lr, wd, steps, record_every=10, sharpness_every=every,
                   theta_every=every)
    entry = int(tr.eos_entry_step)
    wanted = {"start": 0, "descent": 250, "before EoS": entry - 2000, "EoS entry": entry,
              "after EoS": entry + 5000, "end": steps}
    index = {k: int(np.argmin(np.abs(tr.theta_steps - s))) for k, s in wanted.items()}
    thetas = tr.theta[list(index.values())]

    # Exact spectra of every snapshot (D = 40: dense), and the estimators on the chosen ones.
    exact_all = hessian_spectrum(model, tr.theta).eigenvalues            # (snapshots, D)
    exact = exact_all[list(index.values())]
    top = float(np.max(exact))
    grid = np.linspace(np.min(exact) - 0.05 * top, 1.05 * top, 1200)
    dens = spectral_density(model, thetas, n_probes=32, steps=12, grid=grid, sigma=0.01 * top)
    trace = hessian_trace(model, thetas, n_probes=30, method="hutch++")
    m = dens.moments(2)
    per_probe = np.einsum("bpj,bpj->bp", dens.weights, dens.nodes)  # z^T H z / D per probe
    m_err = per_probe.std(axis=1, ddof=1) / np.sqrt(per_probe.shape[1])
    true_m = np.stack([np.mean(exact ** k, axis=1) for k in (1, 2)], axis=1)
    support = np.where(dens.weights > 1e-12, dens.nodes, -np.inf).max(axis=(1, 2))
    # The null bulk: |eigenvalue| below 1e-3 lambda_1 (the smallest outlier sits near 3e-2).
    cut = 1e-3 * exact[:, :1]
    null_mass = np.sum(dens.weights * (np.abs(dens.nodes) < cut[:, :, None]), axis=(1, 2)) / \
        dens.nodes.shape[1]
    rank = np.sum(np.abs(exact) >= cut, axis=1)

    snapshots = {}
    for j, (name, i) in enumerate(index.items()):
        snapshots[name] = {
            "step": int(tr.theta_steps[i]), "eos_ratio": float(tr.eos_ratio[i]),
            "loss": float(model.loss(thetas[j])),
            "lambda_1": float(exact[j, 0]), "lambda_2": float(exact[j, 1]),
            "lambda_min": float(exact[j, -1]), "rank": int(rank[j]),
            "slq_top_node": float(support[j]),
            "slq_top_rel_err": float(abs(support[j] - exact[j, 0]) / exact[j, 0]),
            "slq_mean": float(m[j, 1]), "slq_mean_stderr": float(m_err[j]),
            "exact_mean": float(true_m[j, 0]),
            "slq_second_moment": float(m[j, 2]), "exact_second_moment": float(true_m[j, 1]),
            "slq_null_mass": float(null_mass[j]), "exact_null_mass": float(1 - rank[j] / D),
            "trace_hutchpp": float(trace.estimate[j]), "trace_stderr": float(trace.stderr[j]),
            "trace_exact": float(exact[j].sum()),
        }
    after = index["after EoS"]
    slc = loss_slice(model, tr.theta[after], grid=np.linspace(-0.15, 0.15, 61))

    fig, axes = subplots(2, 2, figsize=(13, 9))
    ax = axes.ravel()
    ax[0].semilogy(tr.sharpness_steps, tr.eos_ratio, lw=0.8, label="eff. LR x sharpness")
    ax[0].axhline(2, color="k", ls="--", lw=0.6)
    for j, (name, i) in enumerate(index.items()):
        ax[0].plot(tr.theta_steps[i], tr.eos_ratio[i], "o", color=f"C{j + 1}", label=name)
    ax[0].set(xlabel="step", ylabel="eff. LR x sharpness",
              title="EoS: eff. LR x sharpness reaches 2")
    ax[0].legend(fontsize=7)
    floor = 1e-4
    for j, name in enumerate(index):
        ax[1].semilogy(grid, np.maximum(dens.density[j], floor), color=f"C{j + 1}", lw=0.9,
                       label=name)
    ax[1].plot(exact[index_pos(index, "after EoS")], np.full(D, 1.5 * floor), "|", color="k",
               ms=10, label="exact, after EoS")
    ax[1].set(xlabel="eigenvalue of H(theta)", ylabel="spectral density", ylim=(floor, None),
              title="SLQ density (32 probes x 12 steps)")
    ax[1].legend(fontsize=7)
    for k in range(6):
        ax[2].plot(tr.theta_steps, exact_all[:, k], lw=0.8, color="C0" if k else "C3")
    ax[2].plot(tr.theta_steps, exact_all[:, -1], lw=0.8, color="C2", label="lambda_min")
    ax[2].axvline(entry, color="k", ls=":", lw=0.8, label=f"EoS entry ({entry})")
    ax[2].set(xlabel="step", ylabel="eigenvalue of H(theta)",
              title="exact top 6 eigenvalues (red: sharpness)")
    ax[2].legend(fontsize=7)
    cs = ax[3].contourf(slc.a, slc.b, np.log10(slc.loss.T + 1e-12), levels=30, cmap="viridis")
    fig.colorbar(cs, ax=ax[3], label="log10 loss")
    ax[3].set(xlabel="a (top eigenvector)", ylabel="b (second eigenvector)",
              title=f"loss at theta + a u1 + b u2, step {int(tr.theta_steps[after])}")
    settings = {"model": f"BNLinearRegression(d={D}, n={model.n})", "lr": lr, "wd": wd,
                "steps": steps, "init": "random, ||w0|| = 10",
                "SLQ": "32 probes x 12 Lanczos steps"}
    figure = save(fig, out, "spectra", "Hessian spectra along GD+WD: bulk and outliers "
                  "before, at and after EoS entry", settings)
    worst = max(s["slq_top_rel_err"] for s in snapshots.values())
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": lr, "wd": wd, "steps": steps, "dim": D,
            "eos_entry_step": entry, "slq_top_node_max_rel_err": worst,
            "sharpness_at_entry": snapshots["EoS entry"]["lambda_1"],
            "outliers_at_entry": snapshots["EoS entry"]["rank"],
            "null_bulk_at_entry": D - snapshots["EoS entry"]["rank"],
            "sharpness_end": snapshots["end"]["lambda_1"],
            "snapshots": snapshots}


def index_pos(index: dict, name: str) -> int:
    """Position of a named snapshot among the chosen ones."""
    return list(index).index(name)
