"""The ``pysharp`` command line: ``demo``, ``sweep``, ``plot``, ``run``, ``reproduce``, ``info``."""

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
    # The theory's sharpness reduction starts at the edge: the peak reached at entry
    # (step 0 is a random start, far from the minimisers and their sharpness), and ends
    # at the mean over the two phases of the period-two oscillation.
    from .sweeps._compute import end_sharpness
    entry = max(int(tr.eos_entry_step), 0)
    at_entry = float(tr.sharpness[tr.sharpness_steps <= entry].max())
    at_end = float(end_sharpness(model, tr.w[None], 0.5, 2e-4)[0])
    print(f"  spherical sharpness {at_entry:.3f} at EoS entry -> {at_end:.3f} at the end "
          f"(step 0: {tr.sharpness[0]:.3f}, a random start), final loss {tr.loss[-1]:.3e}, "
          f"cosine to the min-norm interpolant {cos:.6f}")
    print(f"  ({t_single * 1e3:.0f} ms for the run, sharpness by Lanczos every 500 steps)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"steps": steps, "eos_entry_step": int(tr.eos_entry_step), "cosine_min_norm": cos,
               "sharpness_start": float(tr.sharpness[0]), "sharpness_at_entry": at_entry,
               "sharpness_end": at_end}

    n_side, n_seeds = (12, 2) if args.quick else (32, 4)
    grid = {"lr": np.geomspace(0.05, 2.0, n_side), "wd": np.geomspace(1e-5, 1e-3, n_side),
            "seeds": np.arange(n_seeds)}
    import importlib.util
    store = out / f"demo-sweep-{steps}.zarr" if importlib.util.find_spec("zarr") else None
    n = n_side * n_side * n_seeds
    print(f"\n  sweep: lr x wd = {n_side} x {n_side} (log-spaced) x {n_seeds} seeds = {n} "
          f"trajectories of {steps} steps" + (f" -> {store}" if store else ""))
    t0 = time.perf_counter()
    ds = ps.sweep("bn_linear_regression", **grid, init_norm=10.0, steps=steps,
                  sharpness_every=steps // 50, store=store)
    t_sweep = time.perf_counter() - t0
    summary["sweep"] = _print_sweep(ds, t_sweep) | {"store": str(store) if store else None}
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n  wrote {out / 'demo.json'} (install matplotlib for the figures)")
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
    plt.close(fig)
    from .models._registry import entry_of
    from .sweeps import plot
    plot(ds, x="lr", y="wd", out=out / "demo-sweep.png", metric=list(entry_of(model).plot_metrics))
    print(f"\n  wrote {out / 'demo.png'}, {out / 'demo-sweep.png'} and {out / 'demo.json'}")
    return 0


def _finite_median(values) -> float | None:
    """Median of the finite entries; None (JSON null) when there are none."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else None


def _sweep_summary(ds, seconds: float) -> dict:
    n = int(ds.diverged.size)
    eos = ds.eos_entry_step.values >= 0 if "eos_entry_step" in ds else np.zeros(0, bool)
    summary = {"trajectories": n, "seconds": round(seconds, 3),
               "chunks_computed": int(ds.attrs["chunks_computed"]),
               "chunks_reused": int(ds.attrs["chunks_reused"]),
               "diverged": int(ds.diverged.values.sum())}
    if "eos_entry_step" in ds:
        summary["entered_eos"] = int(eos.sum())
    if "stable" in ds:  # an SGD sweep: the linear-stability verdict at the end points
        summary["linearly_stable"] = int(ds.stable.values.sum())
    if "sharpness_drop" in ds and eos.any():
        summary["median_sharpness_drop"] = _finite_median(ds.sharpness_drop.values)
    if "cosine_min_norm" in ds:
        summary["median_cosine_min_norm"] = _finite_median(ds.cosine_min_norm.values)
    return summary


def _print_sweep(ds, seconds: float) -> dict:
    """Print the summary of a sweep's Dataset; returns it."""
    s = _sweep_summary(ds, seconds)
    steps = int(ds.step.values[-1])
    rate = s["trajectories"] * steps / seconds if s["chunks_computed"] else float("nan")
    print(f"  {s['trajectories']} trajectories in {seconds:.2f} s ({rate:.3g} trajectory-steps/s; "
          f"{s['chunks_computed']} chunks computed, {s['chunks_reused']} reused from the store)")
    print((f"  entered EoS: {s['entered_eos']}, " if "entered_eos" in s else
           f"  linearly stable (rho(T_2) <= 1): {s['linearly_stable']}, "
           if "linearly_stable" in s else "  ")
          + f"diverged: {s['diverged']}"
          + (f", median sharpness drop after EoS entry {s['median_sharpness_drop']:.3g}"
             if s.get("median_sharpness_drop") is not None else "")
          + (f", median cosine to the min-norm interpolant {s['median_cosine_min_norm']:.4f}"
             if s.get("median_cosine_min_norm") is not None else ""))
    return s


def _executor(args):
    """The executor of --scheduler / --workers (None: in-process) and how to close it."""
    if args.scheduler and args.workers:
        raise ValueError("give --scheduler or --workers, not both")
    if args.scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise ImportError("--scheduler needs dask.distributed: "
                              "pip install 'pysharp[distributed]'") from None
        client = Client(args.scheduler)
        return client.get_executor(), client.close
    if args.workers:
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor
        if args.workers < 1:
            raise ValueError("--workers must be >= 1")
        # each worker's engine gets its share of the cores (read when a worker starts,
        # which is on demand: the variable is restored only once the pool is shut down)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.workers))
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))

        def close():
            pool.shutdown()
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        return pool, close
    return None, lambda: None


def _sweep(args) -> int:
    import pysharp as ps

    from .sweeps._config import load_config

    kwargs = load_config(args.config)
    if args.method:
        kwargs["method"] = args.method
    if args.batch:
        kwargs["batch"] = args.batch
    if args.store:
        kwargs["store"] = args.store
    store = Path(kwargs.setdefault("store", Path(args.config).with_suffix(".zarr").name))
    if store.exists() and any(store.iterdir()) and not args.resume:
        raise ValueError(f"{store} exists; pass --resume to continue it, or choose another "
                         "store (output.store or --store)")
    executor, close = _executor(args)
    try:
        t0 = time.perf_counter()
        ds = ps.sweep(**kwargs, executor=executor, progress=not args.no_progress)
        seconds = time.perf_counter() - t0
    finally:
        close()
    _print_sweep(ds, seconds)
    grid = [d for d in ("lr", "batch", "wd", "init_norm", "seed") if d in ds.dims]
    varied = [d for d in grid if ds.sizes[d] > 1] or ["lr"]
    axes = f"--x {varied[0]}" + (f" --y {varied[1]}" if len(varied) > 1 else "")
    metric = "rho_T2" if "rho_T2" in ds else "eos_entry_step"
    print(f"  stored in {store}; plot it with: pysharp plot {store} {axes} --metric {metric}")
    return 0


def _parse_sel(items: list[str]) -> dict:
    sel = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--sel takes AXIS=VALUE, got {item!r}")
        sel[key] = float(value)
    return sel


def _plot(args) -> int:
    from .sweeps import open_sweep, plot

    ds = open_sweep(args.store)
    metrics = args.metric.split(",")
    out = Path(args.out) if args.out else Path(args.store).with_name(
        f"{Path(args.store).stem}-{'-'.join(metrics)}-{args.x}{'-' + args.y if args.y else ''}.png")
    sel = _parse_sel(args.sel)
    plot(ds, x=args.x, y=args.y, hue=args.hue, metric=metrics, reduce=args.reduce,
         sel=sel, out=out)
    from .sweeps._plot import selection_text
    at = selection_text(ds, sel)
    print(f"wrote {out}" + (f" (at {at})" if at else ""))
    return 0


def _model_names() -> list[str]:
    from .models._registry import REGISTRY
    return list(REGISTRY)


def _method_names() -> list[str]:
    from .sweeps._compute import METHOD_DIMS
    return list(METHOD_DIMS)


def _run(args) -> int:
    import pysharp as ps

    params = {}
    for item in args.param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param takes KEY=VALUE, got {item!r}")
        params[key] = json.loads(value) if value[:1] in "-0123456789[{tn" else value
    ds = ps.sweep({"name": args.model, **params}, lr=args.lr, wd=args.wd, seeds=args.seeds,
                  init_norm=args.init_norm, steps=args.steps,
                  sharpness_every=args.sharpness_every, progress=False)
    flat = ds.stack(trajectory=("lr", "wd", "seed", "init_norm"))
    from .models._registry import REGISTRY
    extra = [m for m in REGISTRY[args.model].summaries if m in ds]
    cols = ["lr", "wd", "seed", "init_norm", "eos_entry_step", "final_sharpness", "min_sharpness",
            "final_loss", "final_eff_lr", "diverged"] + extra
    print("  ".join(f"{c:>15s}" for c in cols))
    for t in range(flat.sizes["trajectory"]):
        row = flat.isel(trajectory=t)
        cells = []
        for c in cols:
            v = row[c].values.item()
            cells.append(f"{v!s:>15s}" if isinstance(v, (bool, int)) else f"{v:>15.6g}")
        print("  ".join(cells))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    for t in range(min(flat.sizes["trajectory"], 12)):
        row = flat.isel(trajectory=t)
        name = f"lr {float(row.lr):.3g}, wd {float(row.wd):.2g}"
        ax[0].semilogy(ds.step, row.loss, label=name)
        ax[1].plot(ds.sharpness_step, row.eos_ratio, ".-")
        ax[2].plot(ds.sharpness_step, row.sharpness, ".-")
    ax[0].legend(fontsize=7)
    ax[1].axhline(2, color="k", lw=0.8, ls="--")
    ax[0].set(title="training loss", xlabel="step")
    ax[1].set(title="eff. LR x spherical sharpness", xlabel="step")
    ax[2].set(title="spherical sharpness", xlabel="step")
    fig.tight_layout()
    fig.savefig(out / "run.png", dpi=110)
    print(f"wrote {out / 'run.png'}")
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
    for line in summary.get("side_by_side", []):
        print(f"  {line}")
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
    sw = sub.add_parser("sweep", help="run a TOML-configured lr x wd x seed x init_norm sweep "
                                      "(lr x batch x ... for SGD) into a resumable Zarr store")
    sw.add_argument("config", help="TOML file (see examples/)")
    sw.add_argument("--method", choices=_method_names(),
                    help="the optimiser (overrides run.method; default gd_wd)")
    sw.add_argument("--batch", type=int, nargs="+", metavar="B",
                    help="SGD batch sizes (overrides grid.batch)")
    sw.add_argument("--resume", action="store_true", help="continue an existing store")
    sw.add_argument("--store", help="store path (default: output.store, else CONFIG.zarr)")
    sw.add_argument("--workers", type=int, help="run chunks on N local worker processes")
    sw.add_argument("--scheduler", help="dask.distributed scheduler address")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.set_defaults(func=_sweep)
    pl = sub.add_parser("plot", help="heatmap or line plot of a sweep store to PNG")
    pl.add_argument("store")
    pl.add_argument("--x", default="lr", help="grid axis, or step / sharpness_step")
    pl.add_argument("--y", help="second grid axis: a heatmap (else a line plot)")
    pl.add_argument("--hue", help="line plot: one line per value of this grid axis")
    pl.add_argument("--metric", default="eos_entry_step", help="variable(s), comma-separated")
    pl.add_argument("--reduce", default="mean", help="over the other grid axes: "
                                                     "mean, median, min, max")
    pl.add_argument("--sel", action="append", metavar="AXIS=VALUE",
                    help="fix a grid axis (nearest value) before reducing")
    pl.add_argument("--out", help="PNG path")
    pl.set_defaults(func=_plot)
    rn = sub.add_parser("run", help="one batch of GD+WD trajectories: a table and plots")
    rn.add_argument("model", help="a registered model name: " + ", ".join(_model_names()))
    rn.add_argument("--param", action="append", metavar="KEY=VALUE",
                    help="model parameter, e.g. d=40 (repeatable)")
    rn.add_argument("--lr", type=float, nargs="+", default=[0.5])
    rn.add_argument("--wd", type=float, nargs="+", default=[2e-4])
    rn.add_argument("--seeds", type=int, nargs="+", default=[0])
    rn.add_argument("--init-norm", type=float, nargs="+", default=[10.0])
    rn.add_argument("--steps", type=int, default=20_000)
    rn.add_argument("--sharpness-every", type=int)
    rn.add_argument("--out", default="pysharp-run", help="folder for run.png")
    rn.set_defaults(func=_run)
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
