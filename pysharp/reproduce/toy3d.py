"""Toy 3-D loss: GD+WD oscillates around Gamma = {x = y} and drifts to the flattest point."""

from __future__ import annotations

import numpy as np

from .. import Toy3D, run_gd_wd
from ..flow import SharpnessReductionFlow, compare_to_flow
from . import plt
from ._common import save, theory_start

DESCRIPTION = ("GD+WD on L = (1 + c z^2)(x - y)^2 on the sphere, started near Gamma at phi = 1, "
               "against the sharpness-reduction flow d phi / d tau = -2 G / (4 + G^2).")


#: Steps of the running mean of eff. LR x sharpness in the figure and the JSON: about
#: two cycles of the slow oscillation of its amplitude (~500 steps here).
SMOOTH = 1000


def _phi(theta):
    return np.arctan2(theta[..., 2], (theta[..., 0] + theta[..., 1]) / np.sqrt(2))


def run(out, quick: bool) -> dict:
    c, lr, wd = 10.0, 0.1, 1e-3
    tau_end = 0.3 if quick else 3.0
    steps = int(round(tau_end / (lr * wd)))
    model = Toy3D(c)
    flow = SharpnessReductionFlow(model)
    phi0 = 1.0
    zeta0 = np.array([np.cos(phi0) / np.sqrt(2), np.cos(phi0) / np.sqrt(2), np.sin(phi0)])
    geo = flow.geometry(zeta0)
    w0 = theory_start(zeta0, geo.sharpness, lr, wd, perturbation=1e-4)
    # Jitter keeps x - y from collapsing to exactly 0 in float64 (docs/theory.rst,
    # "The 3-D toy loss").
    # The sharpness at every step: the ratio oscillates with period two and a slow cycle
    # of its amplitude, which any coarser sampling aliases into stripes.
    tr = run_gd_wd(model, w0, lr, wd, steps, record_every=1, sharpness_every=1,
                   theta_every=1, jitter=1e-9, seed=1)
    ratio = np.asarray(tr.eos_ratio, dtype=float).reshape(-1)
    smooth = np.convolve(ratio, np.ones(SMOOTH) / SMOOTH, mode="valid")
    sol = flow.integrate(zeta0, tau_end, project_start=False)
    track = compare_to_flow(tr, sol, t_eos=0)

    pyplot = plt()
    fig = pyplot.figure(figsize=(13.5, 4.8), layout="constrained")
    ax = fig.add_subplot(1, 3, 1, projection="3d")
    u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
    s = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(s) / np.sqrt(2), np.cos(s) / np.sqrt(2), np.sin(s), "k", lw=1.5, label="Gamma")
    th = tr.theta
    ax.plot(th[:, 0], th[:, 1], th[:, 2], color="C3", lw=1.5, label="GD+WD theta_t")
    ax.scatter([1 / np.sqrt(2)], [1 / np.sqrt(2)], [0], color="C2", s=40, label="flattest point")
    ax.set(xlabel="x", ylabel="y", zlabel="z", title="theta_t on the sphere")
    ax.legend(loc="upper left", fontsize=7)
    ax.view_init(elev=15, azim=-30)
    try:  # matplotlib >= 3.7: leave room for the z tick labels inside the panel
        ax.set_box_aspect(None, zoom=0.85)
    except TypeError:
        pass
    tau = lr * wd * tr.theta_steps
    ax = fig.add_subplot(1, 3, 2)
    ax.plot(tau, _phi(th), color="C3", lw=0.8, label="GD+WD")
    ax.plot(sol.tau, _phi(sol.zeta), "k--", label="flow")
    ax.set(xlabel="tau = lr wd t", ylabel="phi (coordinate along Gamma)", title="drift along Gamma")
    ax.legend()
    ax = fig.add_subplot(1, 3, 3)
    ax.plot(tr.sharpness_steps * lr * wd, ratio, color="C0", lw=0.3,
            label="every step")
    mid = tr.sharpness_steps[SMOOTH // 2: SMOOTH // 2 + smooth.size]
    ax.plot(mid * lr * wd, smooth, color="k", lw=1.2, label=f"{SMOOTH}-step mean")
    ax.axhline(2, color="C3", lw=0.8, ls="--")
    ax.set(xlabel="tau = lr wd t", ylabel="eff. LR x spherical sharpness (at theta_t)",
           title="at the edge: eff. LR x sharpness cycles around 2")
    ax.legend(fontsize=8, loc="lower left")
    settings = {"model": f"Toy3D(c={c:g})", "lr": lr, "wd": wd, "steps": steps,
                "start": f"near Gamma at phi = {phi0:g}"}
    figure = save(fig, out, "toy3d", "Toy 3-D loss: GD+WD drifts along Gamma with the "
                  "sharpness-reduction flow", settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "c": c, "lr": lr, "wd": wd, "steps": steps,
            "phi_start": phi0, "phi_end_gd": float(_phi(th[-1])),
            "phi_end_flow": float(_phi(sol.zeta[-1])),
            "sharpness_start": float(sol.sharpness[0]),
            "sharpness_end_flow": float(sol.sharpness[-1]),
            "tracking_error_max": track.max_error, "flow_success": sol.success,
            "eos_ratio_range": [float(ratio.min()), float(ratio.max())],
            "eos_ratio_mean_range": [float(smooth.min()), float(smooth.max())],
            "eos_ratio_mean_window": SMOOTH}
