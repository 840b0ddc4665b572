"""BN linear regression at EoS: period two, eff. LR ~ 2 / sharpness, and Figure 5c-d's slow cycle.

After EoS entry h_t (the top-eigenvector component of theta_t - phi_t) and the effective LR
cycle slowly around the period-two orbit (Lyu et al. Sec. 4.2.3, Figure 5c-d): |h| grows while
eff. LR x sharpness > 2, which shrinks the effective LR, and so on. To leading order
(docs/theory.rst, "The slow cycle at the edge") log|h_t| and x_t = eff_lr lambda_1 - 2 obey
u' = x, x' = 4 lr wd - 8 h^2: a conservative cycle about |h| = sqrt(lr wd / 2), of period
2 pi / sqrt(8 lr wd) once small. In the paper's setting the cycle is there from entry and
decays within tau = lr wd t ~ 0.35 (about 3500 steps) to the steady orbit, in float64 and
float32 alike, from any start; fewer samples (fewer directions across Gamma) make it last.
"""

from __future__ import annotations

import numpy as np

from .. import BNLinearRegression, run_gd_wd
from ..period_two import period_two_diagnostics
from ._common import log_ticks, save, subplots

DESCRIPTION = ("The paper's setting (d 40, n 20, lr 0.5, wd 2e-4): the effective LR grows until it "
               "meets 2 / sharpness, then stays there while the top-eigenvector component of the "
               "gradient flips sign every step; after entry h_t and the effective LR cycle slowly "
               "(Figure 5c-d) until the cycle decays, in float64 and float32 alike; fewer samples "
               "make it last.")

LR, WD = 0.5, 2e-4

#: The slow cycle is over once |h_t| varies by less than this factor over two periods of the
#: small cycle, 2 pi / sqrt(8 lr wd) steps each (222 at lr wd = 1e-4).
SETTLED_FACTOR = 1.5


def cycle_lifetime(loss: np.ndarray, entry: int, lr: float, wd: float) -> float | None:
    """tau = lr wd (t - entry) at which the slow cycle has died out; None if it never does.

    ``loss`` (steps + 1,) is recorded at every step. Near Gamma the loss is lambda_1 h^2 / 2,
    so |h| varies by a factor f where the loss's two-step maximum (free of the period-two
    alternation) varies by f^2. From the loss's first rise out of its floor at entry (to a
    quarter of its final level), windows of two small-cycle periods are scanned (starts every
    fifth of one); the first where that variation is below ``SETTLED_FACTOR`` ends the cycle.
    Not for runs that end before the loss has risen, or that never enter EoS (``entry`` < 0:
    None).
    """
    if entry < 0:
        return None
    env = np.maximum(loss[:-1], loss[1:])
    period = 2 * np.pi / np.sqrt(8 * lr * wd)
    window, stride = int(2 * period), max(1, int(period / 5))
    first = entry + int(np.argmax(env[entry:] >= 0.25 * env[-1]))
    for start in range(first, env.size - window, stride):
        seg = env[start:start + window]
        if seg.max() < SETTLED_FACTOR ** 2 * seg.min():
            return lr * wd * (start - entry)
    return None


def _extrema(log_h: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps of the maxima and minima of log|h| (its two-step maximum) from ``first`` on: the
    peaks and troughs of the slow cycle, each at least 80 steps (a third of the small cycle's
    period) from the next, and rising 0.05 (in log) above its surroundings."""
    from scipy.signal import find_peaks

    peaks, _ = find_peaks(log_h[first:], distance=80, prominence=0.05)
    troughs, _ = find_peaks(-log_h[first:], distance=80, prominence=0.05)
    return peaks + first, troughs + first


def _cycle_run(model, w0, dtype, after: int):
    """GD+WD to ``after`` steps past entry with the sharpness and theta at every step (a
    coarser sampling aliases the cycle and the period-two alternation)."""
    entry_guess = run_gd_wd(model, w0.astype(dtype), LR, WD, 40_000, record_every=40_000,
                            sharpness_every=100).eos_entry_step
    steps = int(entry_guess) + after
    return run_gd_wd(model, w0.astype(dtype), LR, WD, steps, record_every=1, sharpness_every=1,
                     theta_every=1)


def _cycle_numbers(tr) -> dict:
    entry = int(tr.eos_entry_step)
    h = np.abs(np.asarray(tr.top_grad, float) / np.asarray(tr.sharpness, float))
    log_h = np.log10(np.maximum(h[1:], h[:-1]))
    # The cycle proper starts at the first big rise of |h| out of the entry's rounding floor.
    first = entry + int(np.argmax(log_h[entry:] > np.log10(np.sqrt(LR * WD / 2)) - 1))
    peaks, troughs = _extrema(log_h, max(first - 50, entry))
    amplitude = [float(log_h[p] - log_h[troughs[troughs > p][0]])
                 for p in peaks if (troughs > p).any()]
    ratio = np.asarray(tr.eos_ratio, float)
    late = slice(-1000, None)
    return {"eos_entry_step_every_step": entry,
            "cycle_peak_steps": peaks.tolist(),
            "cycle_periods": np.diff(peaks).tolist(),
            "cycle_amplitude_decades": amplitude,
            "h_floor_at_entry": float(10 ** log_h[entry - 200:entry].min()),
            "lifetime_tau": cycle_lifetime(np.asarray(tr.loss, float), entry, LR, WD),
            "h_settled": float(np.median(h[late])),
            "eos_ratio_phases_settled": [float(ratio[late].min()), float(ratio[late].max())],
            "eos_ratio_two_step_mean_settled": float(np.mean(ratio[late]))}


def _variants(quick: bool) -> list[tuple[str, BNLinearRegression, np.ndarray, object]]:
    base = BNLinearRegression.synthetic()
    out = [("paper: float64", base, base.random_point(seed=0, norm=10.0), np.float64),
           ("float32", base, base.random_point(seed=0, norm=10.0), np.float32)]
    if not quick:
        out += [(f"start seed {s}", base, base.random_point(seed=s, norm=10.0), np.float64)
                for s in (1, 2)]
        out += [("start ||w0|| = 3", base, base.random_point(seed=0, norm=3.0), np.float64)]
        for s in (1, 2, 3):
            m = BNLinearRegression.synthetic(seed=s)
            out.append((f"data seed {s}", m, m.random_point(seed=0, norm=10.0), np.float64))
    for n in ((4,) if quick else (10, 6, 4)):
        m = BNLinearRegression.synthetic(n=n)
        out.append((f"n = {n}", m, m.random_point(seed=0, norm=10.0), np.float64))
    return out


def run(out, quick: bool) -> dict:
    lr, wd = LR, WD
    steps = 30_000 if quick else 100_000
    model = BNLinearRegression.synthetic()
    w0 = model.random_point(seed=0, norm=10.0)
    tr = run_gd_wd(model, w0, lr, wd, steps, record_every=1, sharpness_every=250)
    entry = int(tr.eos_entry_step)
    after = tr.eos_ratio[tr.sharpness_steps >= entry]
    # The extremes come from the transient of the first ~1000 steps after entry, where the
    # oscillation builds up and rounding (AVX2 vs AVX-512) is amplified most; the median
    # and the fraction inside the EoS band 2 (1 +- eos_tol) describe the regime itself.
    band = np.abs(after - 2) <= 2 * tr.eos_tol
    window = slice(steps - 60, steps + 1)
    signal = tr.top_grad[window]
    flips = float(np.mean(np.sign(signal[1:]) * np.sign(signal[:-1]) < 0))

    # Figure 5c-d: every step from entry on, in float64 and float32.
    span = 2500 if quick else 5000
    cyc = {name: _cycle_run(model, w0, dtype, span)
           for name, dtype in (("float64", np.float64), ("float32", np.float32))}
    cycles = {name: _cycle_numbers(c) for name, c in cyc.items()}
    # h_t from the proxy <v1, grad L(theta_t)> / lambda_1(theta_t) (first order in h) against
    # its definition <theta_t - phi_t, v1(phi_t)> (projections onto Gamma, costly) on a window.
    check = 50 if quick else 200
    diag = period_two_diagnostics(model, cyc["float64"], window=check)
    c64 = cyc["float64"]
    proxy = (np.asarray(c64.top_grad, float) / np.asarray(c64.sharpness, float))[diag.steps]
    proxy_err = float(np.max(np.abs(np.abs(proxy) - np.abs(diag.h)) / np.abs(diag.h)))
    life = []
    for name, m, start, dtype in _variants(quick):
        run_steps = 200_000 if name.startswith("n =") and not quick else 60_000 if quick \
            else 100_000
        v = run_gd_wd(m, start.astype(dtype), lr, wd, run_steps, record_every=1,
                      sharpness_every=100)
        e = int(v.eos_entry_step)
        life.append({"variant": name, "eos_entry_step": e, "steps": run_steps,
                     "lifetime_tau": cycle_lifetime(np.asarray(v.loss, float), e, lr, wd),
                     "tau_run": lr * wd * (run_steps - e)})
    period_theory = 2 * np.pi / np.sqrt(8 * lr * wd)

    fig, ax = subplots(2, 3, figsize=(14, 8.4))
    ax[0, 0].semilogy(tr.steps, tr.loss, lw=0.6, label="float64")
    ax[0, 0].semilogy(cyc["float32"].steps, cyc["float32"].loss, lw=0.6, alpha=0.7,
                      label=f"float32 (to entry + {span:d})")
    ax[0, 0].axvline(entry, color="C3", ls=":", label=f"EoS entry (step {entry})")
    ax[0, 0].set(xlabel="step", ylabel="training loss", title="training loss")
    ax[0, 0].legend(fontsize=8)
    ax[0, 1].semilogy(tr.steps, tr.eff_lr, lw=0.8, label="effective LR")
    ax[0, 1].semilogy(tr.sharpness_steps, 2 / tr.sharpness, "k--", lw=0.8, label="2 / sharpness")
    ax[0, 1].set(xlabel="step", ylabel="effective LR, 2 / sharpness",
                 title="effective LR meets 2 / sharpness")
    ax[0, 1].legend(fontsize=8)
    ax[0, 2].plot(tr.steps[window] - steps, signal, ".-", lw=0.6)
    ax[0, 2].axhline(0, color="k", lw=0.6)
    ax[0, 2].set(xlabel=f"step - {steps}", ylabel="<v1, grad L(theta)>",
                 title="the last 60 steps: period two")
    for name, c in cyc.items():
        e = int(c.eos_entry_step)
        zoom = slice(e - 300, None)
        r = np.asarray(c.eos_ratio, float)
        mean2 = 0.5 * (r[1:] + r[:-1])                     # the two phases of the orbit averaged
        hh = np.abs(np.asarray(c.top_grad, float) / np.asarray(c.sharpness, float))
        style = {"lw": 0.8} if name == "float64" else {"lw": 0.8, "ls": "--", "alpha": 0.8}
        ax[1, 0].plot(c.steps[1:][zoom] - e, mean2[zoom], label=name, **style)
        ax[1, 1].semilogy(c.steps[zoom] - e, hh[zoom], label=name, **style)
    ax[1, 0].axhline(2, color="k", lw=0.6)
    ax[1, 0].set(xlabel="steps after EoS entry", ylabel="eff. LR x sharpness (two-step mean)",
                 title="Fig. 5c: the effective LR cycles about 2 / sharpness")
    ax[1, 0].legend(fontsize=8)
    ax[1, 1].axhline(np.sqrt(lr * wd / 2), color="k", lw=0.6, ls=":",
                     label="sqrt(lr wd / 2), leading order")
    ax[1, 1].set(xlabel="steps after EoS entry", ylabel="|h_t| ~ |<v1, grad L>| / lambda_1",
                 title=f"Fig. 5d: |h_t| cycles (period -> {cycles['float64']['cycle_periods'][-1]}"
                       f" steps, theory {period_theory:.0f})")
    ax[1, 1].legend(fontsize=8)
    names = [v["variant"] for v in life]
    taus = [v["lifetime_tau"] if v["lifetime_tau"] is not None else v["tau_run"] for v in life]
    colors = ["C0" if v["lifetime_tau"] is not None else "C1" for v in life]
    ax[1, 2].barh(range(len(life)), taus, color=colors)
    ax[1, 2].set_yticks(range(len(life)), names, fontsize=8)
    ax[1, 2].invert_yaxis()
    ax[1, 2].set_xscale("log")
    log_ticks(ax[1, 2], "x")
    ax[1, 2].set(xlabel="tau = lr wd (t - entry) until the cycle has died out",
                 ylabel="variant of the paper's setting",
                 title="the cycle's lifetime (orange: outlives the run)")
    settings = {"model": f"BNLinearRegression(d={model.dim}, n={model.n})", "lr": lr, "wd": wd,
                "steps": steps, "init": "random, ||w0|| = 10", "sharpness every": 250,
                "cycle runs": f"sharpness every step to entry + {span}, float64 and float32"}
    figure = save(fig, out, "bn-linreg-periodic", "BN linear regression at EoS: eff. LR x "
                  "sharpness held at 2, period-two oscillation, and its slow cycle (Fig. 5c-d)",
                  settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": lr, "wd": wd, "steps": steps,
            "eos_entry_step": entry, "eos_ratio_min_after_entry": float(after.min()),
            "eos_ratio_max_after_entry": float(after.max()),
            "eos_ratio_median_after_entry": float(np.median(after)),
            "eos_band": [2 * (1 - tr.eos_tol), 2 * (1 + tr.eos_tol)],
            "eos_ratio_fraction_in_band": float(band.mean()), "eos_ratio_samples": int(after.size),
            "sign_flip_fraction_last_60_steps": flips, "final_loss": float(tr.loss[-1]),
            "cycle": cycles, "cycle_period_theory": float(period_theory),
            "h_settled_theory": float(np.sqrt(lr * wd / 2)),
            "h_proxy_rel_err_max": proxy_err, "h_proxy_window": [int(diag.steps[0]),
                                                                 int(diag.steps[-1])],
            "cycle_lifetimes": life}
