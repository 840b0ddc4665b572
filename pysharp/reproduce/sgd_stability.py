"""SGD on a two-layer net: larger lr and smaller batches find flatter, smoother minima."""

from __future__ import annotations

import numpy as np

from .. import TwoLayerNet, run_sgd, stability
from ._common import save, subplots

DESCRIPTION = ("TwoLayerNet (tanh) trained by SGD to interpolation on 8 points on a circle in "
               "R^8, over lr (up to past the stability edge) x batch size x initialisation: each "
               "minimum found is checked for linear stability by the exact rho(T_2) <= 1, with "
               "lr / (exact critical lr), the sufficient vector criterion and Wu et al.'s s "
               "bound (necessary only for that criterion) beside it, and the almost-sure "
               "notion, the top Lyapunov exponent of linearised SGD; Ma & Ying's k = 2, 3 "
               "gradient-moment bounds; and their g_W, g_x on the training points, smaller "
               "at larger lr and smaller batches.")

#: A run counts as interpolating below this full-batch loss (targets are O(1)).
INTERPOLATION_LOSS = 1e-10
#: Runs and steps of the Lyapunov-exponent estimate at each minimum (stderr ~1e-5 here).
LYAPUNOV_RUNS, LYAPUNOV_STEPS = 16, 10_000


def _circle_data(n: int, d: int, seed: int):
    """n points on a circle embedded isometrically in R^d, and a smooth target on it."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, n)
    Q, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    X = np.stack([np.cos(t), np.sin(t)], axis=1) @ Q.T * np.sqrt(d / 2)
    return X, np.sin(2 * t), Q


def _analyse(model, w, lr: float, batch: int) -> dict:
    """Stability verdict and moments at one minimum found by SGD."""
    q = stability.sharpness_nonuniformity(model, w)
    cond = stability.stability_conditions(model, w, lr, batch, quantities=q)
    sm = stability.input_smoothness(model, w)  # on the training inputs, as Ma & Ying define them
    ly = stability.lyapunov_exponent(model, w, lr, batch, runs=LYAPUNOV_RUNS,
                                     steps=LYAPUNOV_STEPS, seed=5)
    return {"a": float(q.sharpness), "s": float(q.nonuniformity),
            "lr_a": lr * float(q.sharpness),
            "lr_sqrt_kappa_s": lr * np.sqrt(cond.kappa) * float(q.nonuniformity),
            "rho_T2": cond.spectral_radius, "stable": cond.stable,
            "lyapunov": ly.exponent, "lyapunov_stderr": ly.stderr,
            "half_log_rho_T2": ly.moment_bound, "converges_as": ly.converges,
            "sufficient": cond.sufficient, "wu_pair": cond.wu_pair,
            "lr_over_critical": lr / stability.critical_lr(model, w, batch),
            "g_W": float(sm.g_W), "g_x": float(sm.g_x),
            "moment_ratio_k2": float(stability.gradient_moment_ratio(model, w, lr, batch, k=2)),
            "moment_ratio_k3": float(stability.gradient_moment_ratio(model, w, lr, batch, k=3)),
            "multiplicative_inequality_holds": sm.all_hold}


def run(out, quick: bool) -> dict:
    n, d, m = 8, 8, 32
    X, y, _ = _circle_data(n, d, seed=0)
    model = TwoLayerNet(d, m, X=X, y=y)
    # n = 8 points: the tanh kernel on a circle is ill-conditioned for more (at n = 16 its
    # smallest eigenvalue is ~1e-9 of the largest and SGD stalls near loss 1e-6).
    lrs = np.array([0.1, 0.3, 1.0, 3.0]) if not quick else np.array([0.3, 1.0])
    batches = np.array([1, 2, 4, n]) if not quick else np.array([1, n])
    seeds = 2 if quick else 4
    steps = 20_000 if quick else 60_000
    LR, BB, SS = (a.ravel() for a in np.meshgrid(lrs, batches, np.arange(seeds), indexing="ij"))
    W0 = model.random_point(seeds, seed=1)  # one initialisation per seed, shared across (lr, B)
    res = run_sgd(model, W0[SS], LR, BB.astype(int), steps, seed=3)
    rows, missed = [], []
    for j in range(LR.size):
        lr, batch, loss = float(LR[j]), int(BB[j]), float(res.loss[-1, j])
        where = {"lr": lr, "batch": batch, "seed": int(SS[j]), "loss": loss}
        if res.diverged[j] or not loss < INTERPOLATION_LOSS:
            missed.append(where | {"loss": None if res.diverged[j] else loss,
                                   "diverged": bool(res.diverged[j])})
            continue
        rows.append(where | _analyse(model, res.w[j], lr, batch))

    settings = {"model": f"TwoLayerNet(tanh, d {d}, width {m}), {n} points on a circle",
                "lr": " ".join(f"{x:g}" for x in lrs), "batch": " ".join(str(b) for b in batches),
                "initialisations": seeds, "steps": steps}
    figure = _figure(out, rows, lrs, batches, settings)

    def mean_of(key, **where):
        vals = [r[key] for r in rows if all(r[k] == v for k, v in where.items())]
        return float(np.mean(vals)) if vals else float("nan")

    stable = [r for r in rows if r["stable"]]
    small, large = dict(lr=float(lrs.min()), batch=int(n)), dict(lr=1.0, batch=int(batches.min()))
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": lrs.tolist(), "batch": batches.tolist(),
            "n": n, "d": d, "width": m, "steps": steps,
            "runs": int(LR.size), "initialisations": seeds,
            "interpolation_loss": INTERPOLATION_LOSS, "interpolated": len(rows),
            "not_interpolated": missed,
            "diverged": sum(r["diverged"] for r in missed),
            "all_linearly_stable": len(stable) == len(rows),
            "linearly_unstable": [{k: r[k] for k in ("lr", "batch", "seed", "loss", "rho_T2",
                                                     "lyapunov", "lyapunov_stderr")}
                                  for r in rows if not r["stable"]],
            "linearly_stable_count": len(stable),
            "linearly_unstable_count": len(rows) - len(stable),
            "max_rho_T2": max((r["rho_T2"] for r in rows), default=float("nan")),
            "lyapunov_runs": LYAPUNOV_RUNS, "lyapunov_steps": LYAPUNOV_STEPS,
            "max_lyapunov": max((r["lyapunov"] for r in rows), default=float("nan")),
            "all_converge_almost_surely": all(r["converges_as"] for r in rows),
            "second_moment_unstable_but_converging_as": sum(
                (not r["stable"]) and r["converges_as"] for r in rows),
            "max_lyapunov_second_moment_unstable": max(
                (r["lyapunov"] for r in rows if not r["stable"]), default=float("nan")),
            "max_lr_over_critical_lr_for_lr_le_1": max(
                (r["lr_over_critical"] for r in rows if r["lr"] <= 1), default=float("nan")),
            "max_moment_ratio": max((max(r["moment_ratio_k2"], r["moment_ratio_k3"])
                                     for r in rows), default=float("nan")),
            "max_lr_over_critical_lr": max((r["lr_over_critical"] for r in rows),
                                           default=float("nan")),
            "stable_meeting_sufficient_criterion": sum(r["sufficient"] for r in stable),
            "stable_violating_wu_s_bound": sum(not r["wu_pair"] for r in stable),
            "max_moment_ratio_k2": max((r["moment_ratio_k2"] for r in rows), default=float("nan")),
            "max_moment_ratio_k3": max((r["moment_ratio_k3"] for r in rows), default=float("nan")),
            "all_multiplicative_inequalities_hold": all(
                r["multiplicative_inequality_holds"] for r in rows),
            "g_cells": {"small_lr_full_batch": small, "large_lr_batch_1": large},
            "g_W_small_lr_full_batch": mean_of("g_W", **small),
            "g_W_large_lr_batch_1": mean_of("g_W", **large),
            "g_x_small_lr_full_batch": mean_of("g_x", **small),
            "g_x_large_lr_batch_1": mean_of("g_x", **large),
            "table": rows}


def _figure(out, rows, lrs, batches, settings) -> str:
    from matplotlib import colormaps

    fig, ax = subplots(1, 4, figsize=(20, 4.8))
    cmap = colormaps["viridis"]
    colour = {lr: cmap(i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}
    marker = {b: "os^D"[i % 4] for i, b in enumerate(batches)}
    for r in rows:
        c, mk = colour[r["lr"]], marker[r["batch"]]
        face = c if r["stable"] else "none"
        ax[0].plot(r["g_x"], r["g_W"], mk, color=c, alpha=0.8)
        ax[1].plot(r["lr_a"], r["lr_sqrt_kappa_s"], mk, color=c, mfc=face, alpha=0.8)
        ax[2].plot(r["batch"] * np.exp(0.08 * (np.log(r["lr"]) - np.log(lrs).mean())),
                   r["lr_over_critical"], mk, color=c, mfc=face, alpha=0.8)
    for lr in lrs:
        ax[0].plot([], [], "o", color=colour[lr], label=f"lr {lr:g}")
    for b in batches:
        ax[0].plot([], [], marker[b], color="grey", label=f"B {b}")
    ax[0].set(xlabel="g_x (input smoothness)", ylabel="g_W (parameter-gradient moment)",
              title="minima found by SGD, on the training points")
    ax[0].legend(fontsize=7, ncol=2)
    x = np.linspace(0, 2, 200)
    ax[1].plot(x, np.sqrt(1 - (1 - x) ** 2), "k-", lw=0.8,
               label="(1 - lr a)^2 + lr^2 kappa s^2 = 1 (sufficient, one direction)")
    ax[1].axvline(2, color="k", ls=":", lw=0.8, label="lr a = 2 (necessary)")
    ax[1].axhline(1, color="grey", ls="--", lw=0.8, label="Wu et al. s bound (not necessary)")
    top = max([r["lr_sqrt_kappa_s"] for r in rows] + [1.0])
    ax[1].set(xlabel="lr a", ylabel="lr sqrt(kappa) s", xlim=(0, 2.2), ylim=(0, 1.3 * top),
              title="filled: rho(T_2) <= 1 (exact), open: > 1")
    ax[1].legend(fontsize=7, loc="upper left")
    ax[2].axhline(1, color="k", ls=":", lw=0.8)
    ax[2].set(xscale="log", xlabel="batch size", ylabel="lr / exact critical lr",
              title="distance to the exact stability edge", ylim=(0, 1.2))
    ax[2].set_xticks(batches, [str(b) for b in batches])
    ax[2].minorticks_off()
    _lyapunov_panel(ax[3], rows, colour, marker)
    return save(fig, out, "sgd-stability", "SGD on a two-layer net: linear stability of the "
                "minima found", settings)


def _lyapunov_panel(ax, rows, colour, marker) -> None:
    """The two notions of linear stability at each minimum: log(rho(T_2)) / 2 (the second
    moment's growth per step) against the almost-sure exponent gamma, which never exceeds it."""
    for r in rows:
        c, mk = colour[r["lr"]], marker[r["batch"]]
        ax.errorbar(r["half_log_rho_T2"], r["lyapunov"], yerr=2 * r["lyapunov_stderr"], fmt=mk,
                    color=c, mfc=c if r["stable"] else "none", alpha=0.8, ms=5)
    xs = [r["half_log_rho_T2"] for r in rows] or [-1.0, 1.0]
    ys = [r["lyapunov"] for r in rows] or [-1.0, 1.0]
    x_lo, x_hi = min(min(xs), min(ys)), max(max(xs), 0.0)
    pad = 0.08 * (x_hi - x_lo + 1e-12)
    x_lo, x_hi = x_lo - pad, x_hi + pad
    y_lo = min(ys) - pad
    y_hi = max(max(ys), 0.0) + pad
    ax.plot([x_lo, x_hi], [x_lo, x_hi], "k-", lw=0.6,
            label="gamma = log(rho(T_2)) / 2 (its upper bound)")
    ax.axhline(0, color="k", ls=":", lw=0.8)
    ax.axvline(0, color="grey", ls="--", lw=0.8)
    ax.fill_between([0, x_hi], y_lo, 0, color="C3", alpha=0.08,
                    label="second moment grows, almost every run converges")
    for r in rows:
        if not r["stable"]:
            ax.annotate(f"rho(T_2) {r['rho_T2']:.4g}\ngamma {r['lyapunov']:.2g}",
                        (r["half_log_rho_T2"], r["lyapunov"]), fontsize=7,
                        xytext=(-4, 6), textcoords="offset points", ha="right")
    ax.set(xlim=(x_lo, x_hi), ylim=(y_lo, y_hi),
           xlabel="log(rho(T_2)) / 2: second-moment growth per step",
           ylabel="gamma: almost-sure exponent per step (+- 2 s.e.)",
           title="two notions: moments (Ma & Ying) vs almost sure")
    ax.legend(fontsize=7, loc="upper left")
