"""SGD on a two-layer net: larger lr and smaller batches find flatter, smoother minima."""

from __future__ import annotations

import numpy as np

from .. import TwoLayerNet, run_sgd, stability
from . import plt

DESCRIPTION = ("TwoLayerNet (tanh) trained by SGD to interpolation on data on a circle in R^8, "
               "over lr x batch size: the minima found sit inside the linear-stability region "
               "(a <= 2/lr, s <= sqrt(1/kappa)/lr), their parameter- and input-gradient moments "
               "g_W, g_x shrink with larger lr and smaller batches, and the gradient-moment "
               "bound holds (ratio <= 1).")


def _circle_data(n: int, d: int, seed: int):
    """n points on a circle embedded isometrically in R^d, and a smooth target on it."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, n)
    Q, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    X = np.stack([np.cos(t), np.sin(t)], axis=1) @ Q.T * np.sqrt(d / 2)
    return X, np.sin(2 * t), Q


def run(out, quick: bool) -> dict:
    n, d, m = 16, 8, 32
    X, y, Q = _circle_data(n, d, seed=0)
    model = TwoLayerNet(d, m, X=X, y=y)
    lrs = np.array([0.1, 0.3, 0.6, 1.0]) if not quick else np.array([0.1, 1.0])
    batches = np.array([1, 2, 4, 16]) if not quick else np.array([2, 16])
    seeds = 2 if quick else 4
    steps = 20_000 if quick else 100_000
    LR, BB, SS = (a.ravel() for a in np.meshgrid(lrs, batches, np.arange(seeds), indexing="ij"))
    W0 = model.random_point(seed=1)
    res = run_sgd(model, np.broadcast_to(W0, (LR.size, model.dim)), LR, BB.astype(int), steps,
                  seed=3, first_trajectory=0)
    t = np.linspace(0, 2 * np.pi, 200, endpoint=False)
    X_test = np.stack([np.cos(t), np.sin(t)], axis=1) @ Q.T * np.sqrt(d / 2)
    rows = []
    for j in range(LR.size):
        if res.diverged[j] or not res.loss[-1, j] < 1e-6:
            rows.append(None)
            continue
        w = res.w[j]
        q = stability.sharpness_nonuniformity(model, w)
        cond = stability.necessary_conditions(model, w, LR[j], int(BB[j]), quantities=q)
        sm = stability.input_smoothness(model, w, X_test)
        rows.append({"lr": float(LR[j]), "batch": int(BB[j]), "loss": float(res.loss[-1, j]),
                     "a": float(q.sharpness), "s": float(q.nonuniformity),
                     "g_W": float(sm.g_W), "g_x": float(sm.g_x),
                     "conditions_hold": cond.satisfied,
                     "moment_ratio_k1": float(stability.gradient_moment_ratio(
                         model, w, LR[j], int(BB[j]), k=1)),
                     "multiplicative_inequality_holds": sm.all_hold})
    found = [r for r in rows if r is not None]

    pyplot = plt()
    fig, ax = pyplot.subplots(1, 2, figsize=(11.5, 4.2))
    cmap = pyplot.get_cmap("viridis")
    colour = {lr: cmap(i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}
    for r in found:
        marker = "o" if r["batch"] == batches.min() else ("s" if r["batch"] < n else "^")
        ax[0].plot(r["g_x"], r["g_W"], marker, color=colour[r["lr"]], alpha=0.8)
        ax[1].plot(r["a"], r["s"], marker, color=colour[r["lr"]], alpha=0.8)
    for lr in lrs:
        ax[0].plot([], [], "o", color=colour[lr], label=f"lr {lr:g}")
        b = stability.stability_boundary(lr, int(batches.min()), n)
        ax[1].plot(b["a"], b["s"], "-", color=colour[lr], lw=0.8)
        ax[1].axvline(b["a_max"], color=colour[lr], ls=":", lw=0.8)
    ax[0].set(xlabel="g_x (input smoothness)", ylabel="g_W (parameter-gradient moment)",
              title="minima found by SGD (o: smallest batch, ^: full batch)")
    ax[0].legend(fontsize=8)
    top = max([r["s"] for r in found] + [1.0])
    ax[1].set(xlabel="sharpness a", ylabel="non-uniformity s", ylim=(0, 1.5 * top),
              xlim=(0, max(1.1 * 2 / lrs.max(), 1.5 * max([r["a"] for r in found] + [0]))),
              title=f"(a, s) with stability boundaries at batch {batches.min()}")
    fig.tight_layout()
    fig.savefig(out / "sgd_stability.png", dpi=110)
    pyplot.close(fig)

    def mean_of(key, **where):
        vals = [r[key] for r in found if all(r[k] == v for k, v in where.items())]
        return float(np.mean(vals)) if vals else float("nan")

    return {"figures": ["sgd_stability.png"], "n": n, "d": d, "width": m, "steps": steps,
            "runs": int(LR.size), "interpolated": len(found),
            "all_conditions_hold": all(r["conditions_hold"] for r in found),
            "max_moment_ratio_k1": max(r["moment_ratio_k1"] for r in found),
            "all_multiplicative_inequalities_hold": all(
                r["multiplicative_inequality_holds"] for r in found),
            "g_W_smallest_lr_full_batch": mean_of("g_W", lr=float(lrs.min()), batch=int(n)),
            "g_W_largest_lr_smallest_batch": mean_of("g_W", lr=float(lrs.max()),
                                                     batch=int(batches.min())),
            "g_x_smallest_lr_full_batch": mean_of("g_x", lr=float(lrs.min()), batch=int(n)),
            "g_x_largest_lr_smallest_batch": mean_of("g_x", lr=float(lrs.max()),
                                                     batch=int(batches.min())),
            "table": found}
