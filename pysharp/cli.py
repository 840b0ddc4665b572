"""The ``pysharp`` command line: ``demo``, ``reproduce`` and ``info``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _demo(args) -> int:
    import pysharp as ps

    steps = 20_000 if args.quick else 100_000
    model = ps.BNLinearRegression.synthetic()  # the paper's setting: d = 40, n = 20
    w0 = model.random_point(seed=args.seed, norm=10.0)
    print(f"pysharp {ps.__version__}: GD+WD on BN linear regression (d=40, n=20), {steps} steps")

    t0 = time.perf_counter()
    tr = ps.run_gd_wd(model, w0, 0.5, 2e-4, steps, record_every=10, sharpness_every=500)
    t_single = time.perf_counter() - t0
    wt = ps.theory.min_norm_interpolant(model)
    cos = float(tr.w @ wt / (np.linalg.norm(tr.w) * np.linalg.norm(wt)))
    after = tr.eos_ratio[tr.sharpness_steps >= max(tr.eos_entry_step, 0)]
    print(f"  lr 0.5, wd 2e-4: EoS entry at step {tr.eos_entry_step}, "
          f"eff_lr * sharpness after entry in [{after.min():.4f}, {after.max():.4f}] (edge: 2)")
    print(f"  spherical sharpness {tr.sharpness[0]:.3f} -> {tr.sharpness[-1]:.3f}, "
          f"final loss {tr.loss[-1]:.3e}, cosine to the min-norm interpolant {cos:.6f}")
    print(f"  ({t_single * 1e3:.0f} ms for the run, sharpness by Lanczos every 500 steps)")

    lrs = np.array([0.1, 0.2, 0.5, 1.0])
    wds = np.array([5e-5, 1e-4, 2e-4, 5e-4])
    LR, WD = (a.ravel() for a in np.meshgrid(lrs, wds, indexing="ij"))
    t0 = time.perf_counter()
    grid = ps.run_gd_wd(model, w0, LR, WD, steps, record_every=steps // 100,
                        sharpness_every=steps // 20)
    t_grid = time.perf_counter() - t0
    cos_grid = grid.w @ wt / (np.linalg.norm(grid.w, axis=1) * np.linalg.norm(wt))
    print(f"\n  lr x wd grid, {LR.size} trajectories in one call ({t_grid:.2f} s): "
          "EoS entry step / final sharpness / cosine to min-norm")
    print("  " + "lr \\ wd".rjust(8) + "".join(f"{wd:>22.0e}" for wd in wds))
    for i, lr in enumerate(lrs):
        cells = []
        for j in range(len(wds)):
            b = i * len(wds) + j
            cells.append(f"{grid.eos_entry_step[b]:>7d} {grid.sharpness[-1, b]:6.2f} "
                         f"{cos_grid[b]:7.4f}")
        print("  " + f"{lr:>8.2f}" + "".join(f"{c:>22}" for c in cells))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"steps": steps, "eos_entry_step": int(tr.eos_entry_step), "cosine_min_norm": cos,
               "sharpness_start": float(tr.sharpness[0]), "sharpness_end": float(tr.sharpness[-1]),
               "grid": {"lr": LR.tolist(), "wd": WD.tolist(),
                        "eos_entry_step": grid.eos_entry_step.tolist(),
                        "final_sharpness": grid.sharpness[-1].tolist(),
                        "cosine_min_norm": cos_grid.tolist()}}
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n  wrote {out / 'demo.json'} (install matplotlib for the figure)")
        return 0
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ax[0].semilogy(tr.steps, tr.loss)
    ax[0].set(title="training loss", xlabel="step")
    ax[1].plot(tr.sharpness_steps, tr.eos_ratio, ".-")
    ax[1].axhline(2, color="k", lw=0.8, ls="--")
    ax[1].set(title="eff. LR x spherical sharpness", xlabel="step")
    ax[2].plot(tr.sharpness_steps, tr.sharpness, ".-")
    ax[2].set(title="spherical sharpness", xlabel="step")
    fig.tight_layout()
    fig.savefig(out / "demo.png", dpi=110)
    print(f"\n  wrote {out / 'demo.png'} and {out / 'demo.json'}")
    return 0


def _reproduce(args) -> int:
    from . import reproduce

    if args.name == "all":
        results = reproduce.run_all(args.out, quick=args.quick)
        print(f"ran {len(results)} experiments; index at {Path(args.out) / 'index.md'}")
        return 0
    summary = reproduce.run(args.name, args.out, quick=args.quick)
    for key, value in summary.items():
        if not isinstance(value, (list, dict)):
            print(f"  {key}: {value}")
    print(f"figures: {', '.join(summary.get('figures', []))} in {args.out}")
    return 0


def _info(args) -> int:
    import pysharp as ps

    print(json.dumps({"version": ps.__version__, "core": ps.build_info()}, indent=2))
    print("backends:")
    for name, entry in ps.backends().items():
        state = "available" if entry["available"] else f"missing: {entry['reason']}"
        print(f"  {name:6s} {state}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pysharp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="GD+WD in the paper's BN linear regression setting, "
                                       "and a small lr x wd grid")
    demo.add_argument("--quick", action="store_true", help="20k steps instead of 100k")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="pysharp-demo", help="folder for demo.json / demo.png")
    demo.set_defaults(func=_demo)
    rep = sub.add_parser("reproduce", help="the theory's predictions as figures and numbers")
    rep.add_argument("name", help="experiment name, or 'all'")
    rep.add_argument("--out", default="pysharp-figures", help="output folder")
    rep.add_argument("--quick", action="store_true", help="seconds instead of minutes")
    rep.set_defaults(func=_reproduce)
    info = sub.add_parser("info", help="how the compiled core was built and which backends run")
    info.set_defaults(func=_info)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ImportError, ValueError) as exc:  # missing extra or bad argument: no traceback
        print(f"pysharp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
