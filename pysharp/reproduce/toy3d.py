"""The 3-D example: Lyu et al.'s Figure 4 in their Appendix F's setting, and Toy3D with the flow.

``toy3d.png`` is Figure 4: GD+WD (lr 0.5, wd 0.08) from w0 = (0.3, 1.3, 1.2) on a loss with
the properties Appendix F names (``figure4_toy.hpp`` beside this file, loaded at run time:
compiled once per machine, then cached). ``toy3d-flow.png`` is pysharp's own setting on the
built-in Toy3D (lr wd 1e-4, started at the edge), where the drift follows the
sharpness-reduction flow closely.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import Toy3D, run_gd_wd
from ..flow import SharpnessReductionFlow, compare_to_flow
from ..models import ModelCompileError, load_model
from ..models._compiler import compiler
from . import plt
from ._common import save, theory_start

DESCRIPTION = ("Lyu et al.'s Figure 4 in their appendix's setting (lr 0.5, wd 0.08, "
               "w0 = (0.3, 1.3, 1.2)): GD+WD approaches a minimiser, enters EoS, oscillates "
               "around Gamma = {x = y > 0} and drifts to the flattest point z = 0; and Toy3D "
               "(1 + c z^2)(x - y)^2 near Gamma at phi = 1 against the flow "
               "d phi / d tau = -2 G / (4 + G^2).")

#: The header of Figure 4's loss, log(1 + a (1 - cos alpha)) (docs/tutorials/reproduce.rst).
HEADER = Path(__file__).with_name("figure4_toy.hpp")

#: Appendix F's setting.
FIGURE4_LR, FIGURE4_WD = 0.5, 0.08
FIGURE4_W0 = (0.3, 1.3, 1.2)

#: Steps of the running mean of eff. LR x sharpness in the Toy3D figure and the JSON: about
#: two cycles of the slow oscillation of its amplitude (~500 steps there).
SMOOTH = 1000


def figure4_toy(a: float = 4.0):
    """Figure 4's loss, L(w) = log(1 + a (1 - cos alpha)), cos alpha = (x + y) / |(x, y)| / sqrt 2.

    Scale-invariant on R^3 without the z axis, minimal (0) on Gamma = {x = y > 0} of the
    sphere, spherical sharpness a / (1 - z^2) on Gamma. The first call compiles
    ``figure4_toy.hpp`` (tens of seconds; cached per user afterwards). An illustration of
    the theory in three dimensions, not a model of data; undefined on the z axis (x = y = 0),
    so a start there is refused. Where a compiler is missing, use ``Toy3D`` (built in).

    Parameters
    ----------
    a : float
        Curvature across Gamma at z = 0 (> 0). Above 1 the period-two orbit at the edge
        attracts; at 1 its slow cycle is neutral (as Toy3D's at z = 0), below it grows.

    Returns
    -------
    pysharp.LoadedModel
        D = 3.
    """
    if not a > 0:
        raise ValueError(f"a must be > 0, got {a!r}")
    return load_model(HEADER, a=float(a))


def lacking() -> str | None:
    """What this experiment needs beyond Python packages and the machine lacks: the C++
    compiler that compiles ``figure4_toy.hpp`` at its first use (None when one is there)."""
    try:
        compiler()
    except ModelCompileError as exc:
        return f"a C++ compiler for Figure 4's loss ({HEADER.name}): {exc}"
    return None


def _phi(theta):
    """Latitude on the sphere of points near Gamma: the angle of theta above the xy-plane,
    measured along the plane through the z axis and the diagonal."""
    return np.arctan2(theta[..., 2], (theta[..., 0] + theta[..., 1]) / np.sqrt(2))


def _to_plot(theta):
    """The plot's orthogonal map: a rotation by -45 degrees about z, taking Gamma to the
    meridian {y' = 0, x' > 0} that faces the viewer."""
    x, y, z = theta[..., 0], theta[..., 1], theta[..., 2]
    return (x + y) / np.sqrt(2), (y - x) / np.sqrt(2), z


def _sphere(ax, loss_of_alpha, vmax: float) -> None:
    """The unit sphere coloured by the loss (a function of the plot's longitude alone)."""
    from matplotlib import cm, colors

    lon, colat = np.mgrid[-np.pi:np.pi:73j, 0:np.pi:37j]
    x, y, z = np.cos(lon) * np.sin(colat), np.sin(lon) * np.sin(colat), np.cos(colat)
    shade = cm.Blues(colors.Normalize(0, vmax)(loss_of_alpha(lon)))
    shade[..., 3] = 0.35
    ax.plot_surface(x, y, z, facecolors=shade, rstride=1, cstride=1, linewidth=0,
                    shade=False)


def _figure4(quick: bool) -> tuple[object, dict]:
    lr, wd, a = FIGURE4_LR, FIGURE4_WD, 4.0
    steps = 200 if quick else 400
    model = figure4_toy(a)
    w0 = np.array(FIGURE4_W0)
    tr = run_gd_wd(model, w0, lr, wd, steps, record_every=1, sharpness_every=1, theta_every=1)
    th = np.asarray(tr.theta)
    h = (th[:, 1] - th[:, 0]) / np.sqrt(2)            # sin(alpha) on the sphere ~ h_t
    z = th[:, 2]
    ratio = np.asarray(tr.eos_ratio, dtype=float)
    loss = np.asarray(tr.loss, dtype=float)
    entry = int(tr.eos_entry_step)
    h_star = np.sqrt(lr * wd / 2)                     # the orbit's |h| to leading order
    # Closest to Gamma (the first minimiser) before the edge; then the oscillation builds up
    # from that residue and has taken over where |h| first reaches half the orbit's amplitude.
    rest = 1 + int(np.argmin(np.abs(h[1:entry + 1])))
    grown = rest + int(np.argmax(np.abs(h[rest:]) >= h_star / 2))
    zeta0 = np.array([np.cos(_phi(th[entry]))] * 2 + [np.sqrt(2) * np.sin(_phi(th[entry]))])
    zeta0 /= np.linalg.norm(zeta0)
    flow = SharpnessReductionFlow(model)
    tau_end = lr * wd * (steps - entry)
    sol = flow.integrate(zeta0, tau_end, project_start=False)
    settled = slice(steps // 2, steps + 1)
    tan_phi = np.abs(np.tan(_phi(th)))
    fit = np.polyfit(np.arange(steps + 1)[settled], np.log(tan_phi[settled]), 1)[0]
    flips = np.sign(h[settled][1:]) * np.sign(h[settled][:-1]) < 0

    # Toy3D in the same setting, for the record: at lr wd = 0.04 it leaves Gamma. Its orbit
    # is chaotic: one start's largest |x - y| ranged over 0.25-1.1 between 1e-15 changes of
    # w0 (and between CPUs), so the gap is the largest over w0 and 15 such changes of it.
    nudges = 1.0 + 1e-15 * np.random.default_rng(0).standard_normal((15, 3))
    starts = np.vstack([w0, w0 * nudges])
    toy = run_gd_wd(Toy3D(10.0), starts, lr, wd, 1000, record_every=1, sharpness_every=1,
                    theta_every=1)
    toy_gap = np.abs(toy.theta[200:, :, 0] - toy.theta[200:, :, 1])
    toy_ratio = np.asarray(toy.eos_ratio, dtype=float)[200:, 0]  # w0's own run

    pyplot = plt()
    fig = pyplot.figure(figsize=(13.5, 6.2), layout="constrained")
    grid = fig.add_gridspec(3, 2, width_ratios=[1.15, 1])
    # computed_zorder off: the curves are drawn over the translucent sphere, not hidden by it
    ax = fig.add_subplot(grid[:, 0], projection="3d", computed_zorder=False)
    _sphere(ax, lambda lon: np.log1p(a * (1 - np.cos(lon))), np.log1p(2 * a))
    s = np.linspace(-np.pi / 2 + 1e-3, np.pi / 2 - 1e-3, 200)
    ax.plot(np.cos(s), 0 * s, np.sin(s), "k", lw=2, label="Gamma (minimisers)")
    px, py, pz = _to_plot(th)
    ax.plot(px, py, pz, color="C3", lw=0.7, label="GD+WD theta_t")
    ax.scatter(*_to_plot(th[0]), color="k", s=25, label="start w0 / ||w0||")
    ax.scatter(*_to_plot(th[rest]), color="C1", s=40, label=f"first minimiser (step {rest})")
    ax.scatter([1], [0], [0], color="C2", s=50, label="flattest point z = 0", zorder=3)
    ax.set(xlabel="(x + y) / sqrt 2", ylabel="(y - x) / sqrt 2", zlabel="z",
           xticks=[-1, 0, 1], yticks=[-1, 0, 1], zticks=[-1, 0, 1],
           title="theta_t on the sphere (rotated 45 degrees about z)")
    ax.view_init(elev=15, azim=12)
    ax.legend(loc="upper left", fontsize=7)
    try:  # matplotlib >= 3.7: leave room for the z tick labels inside the panel
        ax.set_box_aspect(None, zoom=0.9)
    except TypeError:
        pass
    t = np.arange(steps + 1)
    ax = fig.add_subplot(grid[0, 1])
    ax.semilogy(t, tan_phi, color="C3", lw=1, label="GD+WD")
    ax.semilogy(entry + sol.tau / (lr * wd), np.abs(np.tan(_phi(sol.zeta))), "k--", lw=1,
                label=f"flow from the first minimiser (tau = lr wd (t - {entry}))")
    ax.axvline(entry, color="0.5", ls=":", lw=0.8)
    ax.set(xlabel="step", ylabel="tan(latitude)",
           title="drift along Gamma to z = 0: tan(latitude) = sqrt(2) z / (x + y)")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(grid[1, 1], sharex=ax)
    ax.plot(t, ratio, color="C0", lw=0.8)
    ax.axhline(2, color="C3", lw=0.8, ls="--")
    ax.axvline(entry, color="0.5", ls=":", lw=0.8, label=f"EoS entry (step {entry})")
    ax.set(xlabel="step", ylabel="eff. LR x sharpness",
           title="the effective LR grows to the edge (sharpness at theta_t)")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(grid[2, 1], sharex=ax)
    ax.semilogy(t, np.abs(h), color="C3", lw=0.8, label="|h_t| = |y - x| / sqrt 2")
    ax.semilogy(t, loss, color="0.4", lw=0.8, label="loss")
    ax.axhline(h_star, color="k", lw=0.8, ls="--", label="sqrt(lr wd / 2)")
    ax.set(xlabel="step", ylabel="|h_t|, loss", title="approach, then period-two oscillation")
    ax.legend(fontsize=7, loc="lower right")
    settings = {"model": f"Figure4Toy(a={a:g}): log(1 + a (1 - cos alpha))", "lr": lr,
                "wd": wd, "steps": steps, "start": "w0 = (0.3, 1.3, 1.2) (Appendix F)"}
    numbers = {
        "settings": settings, "a": a, "lr": lr, "wd": wd, "steps": steps,
        "w0": list(FIGURE4_W0), "loss_start": float(loss[0]),
        "first_minimiser_step": rest, "loss_at_first_minimiser": float(loss[rest]),
        "z_first_minimiser": float(z[rest]),
        "sharpness_first_minimiser_theory": float(a / np.cos(_phi(th[rest])) ** 2),
        "eos_entry_step": entry, "oscillation_grown_step": grown,
        "eos_ratio_peak": float(ratio[:grown + 5].max()),
        "eos_ratio_median_settled": float(np.median(ratio[settled])),
        "h_amplitude_settled": float(np.median(np.abs(h[settled]))),
        "h_amplitude_theory": float(h_star),
        "sign_flip_fraction_settled": float(flips.mean()),
        "z_end": float(z[-1]), "z_at_step_200": float(z[min(200, steps)]),
        "tan_latitude_decay_per_step": float(-fit),
        "tan_latitude_decay_gd_exact": float(-np.log(1 - lr * wd)),
        "tan_latitude_decay_flow": lr * wd,
        # GD+WD runs ahead of the flow in the first swing, then decays at its rate
        "tan_latitude_gd_over_flow_end": float(
            tan_phi[-1] / abs(np.tan(_phi(sol.zeta[-1])))),
        "sharpness_end_flow": float(sol.sharpness[-1]), "flow_success": bool(sol.success),
        "toy3d_same_setting": {"max_abs_x_minus_y_after_200": float(toy_gap.max()),
                               "starts": len(starts), "start_nudge": 1e-15,
                               "eos_ratio_range_after_200": [float(toy_ratio.min()),
                                                             float(toy_ratio.max())],
                               "z_at_step_200": float(toy.theta[200, 0, 2])},
    }
    return fig, numbers


def _toy3d_flow(quick: bool) -> tuple[object, dict]:
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
    numbers = {"settings": settings, "c": c, "lr": lr, "wd": wd, "steps": steps,
               "phi_start": phi0, "phi_end_gd": float(_phi(th[-1])),
               "phi_end_flow": float(_phi(sol.zeta[-1])),
               "sharpness_start": float(sol.sharpness[0]),
               "sharpness_end_flow": float(sol.sharpness[-1]),
               "tracking_error_max": track.max_error, "flow_success": sol.success,
               "eos_ratio_range": [float(ratio.min()), float(ratio.max())],
               "eos_ratio_mean_range": [float(smooth.min()), float(smooth.max())],
               "eos_ratio_mean_window": SMOOTH}
    return fig, numbers


def run(out, quick: bool) -> dict:
    fig4, paper = _figure4(quick)
    figure = save(fig4, out, "toy3d", "Lyu et al.'s Figure 4 in their Appendix F's setting: "
                  "approach, EoS, oscillation around Gamma, drift to z = 0", paper["settings"])
    fig_flow, own = _toy3d_flow(quick)
    figure_flow = save(fig_flow, out, "toy3d-flow", "Toy 3-D loss: GD+WD drifts along Gamma "
                       "with the sharpness-reduction flow", own["settings"])
    return {"figures": [figure, figure_flow], "settings": paper["settings"],
            "figure_settings": {figure: paper["settings"], figure_flow: own["settings"]},
            "model": paper["settings"]["model"], "figure4": paper,
            **{k: v for k, v in own.items() if k != "settings"}}
