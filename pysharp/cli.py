"""The pysharp command line: demo, sweep, plot, run, reproduce, info."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import re
import shlex
import signal
import sys
import textwrap
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import pysharp as ps

from . import reproduce
from ._engine.methods import METHODS
from ._version import __version__
from .models import _compiler, from_jax_file, load_model_files
from .models._registry import REGISTRY, entry_of
from .sweeps import open_sweep, plot
from .sweeps._compute import METHOD_DIMS, end_sharpness
from .sweeps._config import load_config, model_parameters, whole_number
from .sweeps._plot import selection_text
from .sweeps._spec import factory_parameters
from .sweeps._sweep import SweepDiskFull, SweepInterrupted

#: The demo's single run: the paper's BN linear regression setting.
_DEMO = {"model": "bn_linear_regression", "d": 40, "n": 20, "lr": 0.5, "wd": 2e-4,
         "init_norm": 10.0, "record_every": 10, "sharpness_every": 500, "eos_tol": 0.05}


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _summary_and_axes(path: Path, summary: dict, figsize: tuple[float, float]):
    """Write ``summary`` as JSON to ``path``; then a figure of three panels side by side,
    (fig, axes), or (None, None) with a note where matplotlib is absent."""
    path.write_text(json.dumps(summary, indent=2))
    plt = _pyplot()
    if plt is None:
        print(f"wrote {path} (install matplotlib for the figures)")
        return None, None
    return plt.subplots(1, 3, figsize=figsize, layout="constrained")


def _entry_text(entry: int, every: int, eos_tol: float) -> str:
    """What an EoS entry step measures: the first sharpness record at the edge, known to
    within the record spacing ``every``."""
    edge = f"eff_lr * sharpness >= {2 * (1 - eos_tol):g} = 2 (1 - eos_tol)"
    if entry < 0:
        return f"no EoS entry (no sharpness record with {edge}; records every {every} steps)"
    if entry == 0:
        return f"EoS entry at step 0 (the first sharpness record already has {edge})"
    return (f"EoS entry at step {entry} (first sharpness record with {edge}; records every "
            f"{every} steps, so entry lies in ({entry - every}, {entry}])")


def _model_parameters(name: str, params: dict) -> dict:
    """A registered model's factory parameters, the defaults filled in (its sizes among them)."""
    sig = inspect.signature(REGISTRY[name].factory).parameters
    return {k: params.get(k, sig[k].default) for k in factory_parameters(name)}


def _model_title(name: str, params: dict) -> str:
    """``name (k=v, ...)`` with the factory's defaults filled in."""
    full = _model_parameters(name, params)
    return f"{name} ({', '.join(f'{k}={v}' for k, v in full.items())})"


def _interrupted(command: str, stop, again: str) -> int:
    """Say what an interrupted sweep (or one stopped by a full disk) kept and how to continue;
    the exit status: 130 (interrupted), 1 (disk full)."""
    if isinstance(stop, SweepDiskFull):
        print(f"\npysharp {command}: the disk holding {stop.store} is full: {stop.done} of "
              f"{stop.n_chunks} chunks saved there; free some space, then run `{again}` to "
              "compute only the missing ones", file=sys.stderr)
        return 1
    if stop.store is None:
        print(f"\npysharp {command}: interrupted after {stop.done} of {stop.n_chunks} chunks; "
              "without a store nothing was kept", file=sys.stderr)
    else:
        print(f"\npysharp {command}: interrupted: {stop.done} of {stop.n_chunks} chunks saved "
              f"to {stop.store}; run `{again}` to compute only the missing ones",
              file=sys.stderr)
    return 130


def _demo(args) -> int:
    steps = 20_000 if args.quick else 100_000
    c = _DEMO
    every = c["sharpness_every"]
    model = ps.BNLinearRegression.synthetic(d=c["d"], n=c["n"])  # the paper's setting
    w0 = model.random_point(seed=args.seed, norm=c["init_norm"])
    print(f"pysharp {ps.__version__}: GD+WD on BN linear regression (d={c['d']}, n={c['n']}), "
          f"{steps} steps")

    t0 = time.perf_counter()
    tr = ps.run_gd_wd(model, w0, c["lr"], c["wd"], steps, record_every=c["record_every"],
                      sharpness_every=every, eos_tol=c["eos_tol"])
    t_single = time.perf_counter() - t0
    wt = ps.theory.min_norm_interpolant(model)
    cos = float(tr.w @ wt / (np.linalg.norm(tr.w) * np.linalg.norm(wt)))
    entry_step = int(tr.eos_entry_step)
    print(f"  lr {c['lr']}, wd {c['wd']:g}: {_entry_text(entry_step, every, c['eos_tol'])}")
    after = tr.eos_ratio[tr.sharpness_steps >= max(entry_step, 0)]
    print(f"  eff_lr * sharpness after entry in [{after.min():.4f}, {after.max():.4f}] (edge: 2)")
    # The theory's sharpness reduction starts at the edge: the peak reached at entry
    # (step 0 is a random start, far from the minimisers and their sharpness), and ends
    # at the mean over the two phases of the period-two oscillation.
    entry = max(entry_step, 0)
    at_entry = float(tr.sharpness[tr.sharpness_steps <= entry].max())
    at_end = float(end_sharpness(model, tr.w[None], c["lr"], c["wd"])[0])
    print(f"  spherical sharpness {at_entry:.3f} at EoS entry -> {at_end:.3f} at the end "
          f"(step 0: {tr.sharpness[0]:.3f}, a random start), final loss {tr.loss[-1]:.3e}, "
          f"cosine to the min-norm interpolant {cos:.6f}")
    print(f"  ({t_single * 1e3:.0f} ms for the run, sharpness by Lanczos every {every} steps)")

    out = Path(args.out if args.out else "pysharp-demo/quick" if args.quick else "pysharp-demo")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"model": c["model"], "d": c["d"], "n": c["n"], "lr": c["lr"], "wd": c["wd"],
               "steps": steps, "seed": args.seed, "init_norm": c["init_norm"],
               "record_every": c["record_every"], "sharpness_every": every,
               "eos_tol": c["eos_tol"], "eos_entry_step": entry_step,
               "eos_entry_definition": "first sharpness record (every sharpness_every steps) "
                                       "with eff_lr * sharpness >= 2 (1 - eos_tol); -1: never",
               "eos_entry_resolution_steps": every, "cosine_min_norm": cos,
               "sharpness_start": float(tr.sharpness[0]), "sharpness_at_entry": at_entry,
               "sharpness_end": at_end}

    n_side, n_seeds = (12, 2) if args.quick else (32, 4)
    lr_range, wd_range = (0.05, 2.0), (1e-5, 1e-3)
    grid = {"lr": np.geomspace(*lr_range, n_side), "wd": np.geomspace(*wd_range, n_side),
            "seeds": np.arange(n_seeds)}
    sweep_every = steps // 50
    store = out / f"demo-sweep-{steps}.zarr" if importlib.util.find_spec("zarr") else None
    n = n_side * n_side * n_seeds
    print(f"\n  sweep: lr x wd = {n_side} x {n_side} (log-spaced) x {n_seeds} seeds = {n} "
          f"trajectories of {steps} steps" + (f" -> {store}" if store else ""))
    t0 = time.perf_counter()
    try:
        ds = ps.sweep(c["model"], **grid, init_norm=c["init_norm"], steps=steps,
                      sharpness_every=sweep_every, store=store)
    except SweepInterrupted as stop:
        again = "pysharp demo" + (" --quick" if args.quick else "") + (
            f" --seed {args.seed}" if args.seed else "") + (
            f" --out {shlex.quote(args.out)}" if args.out else "")
        return _interrupted("demo", stop, again)
    t_sweep = time.perf_counter() - t0
    summary["sweep"] = _print_sweep(ds, t_sweep) | {
        "store": str(store) if store else None,
        "grid": {"lr": {"geomspace": [*lr_range, n_side]},
                 "wd": {"geomspace": [*wd_range, n_side]},
                 "seeds": {"range": n_seeds}, "init_norm": c["init_norm"]},
        "steps": steps, "sharpness_every": sweep_every, "eos_tol": c["eos_tol"],
        "eos_entry_resolution_steps": sweep_every}
    fig, ax = _summary_and_axes(out / "demo.json", summary, figsize=(13, 4.0))
    if fig is None:
        return 0
    ax[0].semilogy(tr.steps, tr.loss)
    ax[0].set(title="training loss", xlabel="step", ylabel="loss")
    ax[1].plot(tr.sharpness_steps, tr.eos_ratio, ".-")
    ax[1].axhline(2, color="k", lw=0.8, ls="--", label="edge: 2")
    ax[1].set(title="eff. LR x spherical sharpness", xlabel="step",
              ylabel=r"$\eta_{\mathrm{eff}}\,\lambda_1$")
    ax[2].plot(tr.sharpness_steps, tr.sharpness, ".-")
    ax[2].set(title="spherical sharpness", xlabel="step", ylabel=r"$\lambda_1$ of $H(w/\|w\|)$")
    if entry_step >= 0:
        for a in ax:
            a.axvline(entry_step, color="C3", lw=0.9, ls=":",
                      label=f"EoS entry: record at step {entry_step}\n"
                            f"(entry in ({entry_step - every}, {entry_step}])")
    ax[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"GD+WD on BN linear regression (d = {c['d']}, n = {c['n']}): lr {c['lr']}, "
                 f"wd {c['wd']:g}, {steps} steps, seed {args.seed}, "
                 f"||w0|| = {c['init_norm']:g}; sharpness every {every} steps", fontsize=10)
    fig.savefig(out / "demo.png", dpi=110)
    _pyplot().close(fig)
    fig = plot(ds, x="lr", y="wd", metric=list(entry_of(model).plot_metrics))
    fig.suptitle(f"GD+WD on BN linear regression (d = {c['d']}, n = {c['n']}): "
                 f"{n_side} x {n_side} log-spaced lr x wd, mean over {n_seeds} seeds, "
                 f"||w0|| = {c['init_norm']:g}, {steps} steps, sharpness every {sweep_every} "
                 "steps", fontsize=10)
    fig.savefig(out / "demo-sweep.png", dpi=110)  # sweeps.plot lays out (constrained)
    _pyplot().close(fig)
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
               "trajectories_computed": int(ds.attrs.get(
                   "trajectories_computed", n if ds.attrs["chunks_computed"] else 0)),
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
    """Print the summary of a sweep's Dataset; returns it.

    The rate counts only the trajectories this call computed (not those reused from a
    store); a call that computed nothing says so instead of printing a rate.
    """
    s = _sweep_summary(ds, seconds)
    steps = int(ds.step.values[-1])
    if not s["chunks_computed"]:
        print(f"  {s['trajectories']} trajectories: all {s['chunks_reused']} chunks reused from "
              f"the store; nothing computed ({seconds:.2f} s to check and open them)")
    else:
        computed = s["trajectories_computed"]
        rate = computed * steps / seconds
        s["trajectory_steps_per_s"] = rate
        print(f"  {s['trajectories']} trajectories, {computed} computed in {seconds:.2f} s "
              f"({rate:.3g} trajectory-steps/s; {s['chunks_computed']} chunks computed, "
              f"{s['chunks_reused']} reused from the store)")
    print((f"  entered EoS: {s['entered_eos']}, " if "entered_eos" in s else
           f"  linearly stable (rho(T_2) <= 1): {s['linearly_stable']}, "
           if "linearly_stable" in s else "  ")
          + f"diverged: {s['diverged']}"
          + (f", median sharpness drop after EoS entry {s['median_sharpness_drop']:.3g}"
             if s.get("median_sharpness_drop") is not None else "")
          + (f", median cosine to the min-norm interpolant {s['median_cosine_min_norm']:.4f}"
             if s.get("median_cosine_min_norm") is not None else ""))
    return s


#: How often (seconds) a worker checks that the process that started it is alive.
_ORPHAN_POLL = 0.2


def _start_worker(parent: int) -> None:
    """A worker's initializer: leave Ctrl-C to the parent, which stops the sweep and says so,
    and exit when the parent is gone.

    A worker of a ``ProcessPoolExecutor`` waits on a pipe whose writing end it holds too,
    so a parent killed outright (SIGKILL, OOM) would leave it and multiprocessing's
    resource tracker blocked for good. A daemon thread polls ``os.getppid()``, which
    changes when the parent dies (the worker is re-parented), and ends the worker at once
    (``os._exit``: its chunk's result would have nowhere to go).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="pysharp-orphan-watch", daemon=True).start()


def _executor(args):
    """The executor of --scheduler / --workers (None: in-process) and how to close it
    (``close(interrupted=True)`` stops at once, dropping the chunks in flight)."""
    if args.scheduler and args.workers:
        raise ValueError("give --scheduler or --workers, not both")
    if args.scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise ImportError("--scheduler needs dask.distributed: "
                              "pip install 'pysharp[distributed]'") from None
        client = Client(args.scheduler)
        return client.get_executor(), lambda interrupted=False: client.close()
    if args.workers:
        if args.workers < 1:
            raise ValueError("--workers must be >= 1")
        # each worker's engine gets its share of the cores (read when a worker starts,
        # which is on demand: the variable is restored only once the pool is shut down)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.workers))
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker, initargs=(os.getpid(),))

        def close(interrupted: bool = False):
            if interrupted:  # the running chunks' results would be dropped anyway
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
                pool.shutdown(wait=True, cancel_futures=True)
            else:
                pool.shutdown()
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        return pool, close
    return None, lambda interrupted=False: None


def _sweep(args) -> int:
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
    interrupted = False
    try:
        t0 = time.perf_counter()
        ds = ps.sweep(**kwargs, executor=executor, progress=not args.no_progress)
        seconds = time.perf_counter() - t0
    except (SweepInterrupted, SweepDiskFull) as stop:
        interrupted = True
        again = " ".join(["pysharp"] + [shlex.quote(a) for a in args.argv]
                         + ([] if args.resume else ["--resume"]))
        return _interrupted("sweep", stop, again)
    finally:
        close(interrupted=interrupted)
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
    ds = open_sweep(args.store)
    metrics = args.metric.split(",")
    out = Path(args.out) if args.out else Path(args.store).with_name(
        f"{Path(args.store).stem}-{'-'.join(metrics)}-{args.x}{'-' + args.y if args.y else ''}.png")
    sel = _parse_sel(args.sel)
    plot(ds, x=args.x, y=args.y, hue=args.hue, metric=metrics, reduce=args.reduce,
         sel=sel, out=out)
    at = selection_text(ds, sel)
    print(f"wrote {out}" + (f" (at {at})" if at else ""))
    return 0


def _model_names() -> list[str]:
    # a loaded model is named by its header's path instead
    return [name for name in REGISTRY if not name.startswith("loaded")]


def _method_names() -> list[str]:
    return list(METHOD_DIMS)


def _params(items: list[str] | None, model: str) -> dict:
    """``--param KEY=VALUE`` items as the model factory's typed parameters."""
    return model_parameters(model, _key_values(items), "--param")


def _key_values(items: list[str] | None) -> dict[str, str]:
    """``--param KEY=VALUE`` items as a dict of text values."""
    raw = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param takes KEY=VALUE, got {item!r}")
        raw[key] = value
    return raw


def _is_header(model: str) -> bool:
    return model.endswith((".hpp", ".h", ".hh", ".hxx")) or Path(model).is_file()


def _is_python(model: str) -> bool:
    return ".py:" in model


def _run_model(args) -> tuple:
    """(model or spec, registry name, title, parameters) of ``pysharp run``'s MODEL argument:
    a registered name with ``--param`` factory parameters, or a model header with
    ``--data`` arrays and ``--param`` scalar fields."""
    if _is_python(args.model):
        if args.dim is None:
            raise ValueError("a JAX model (FILE.py:FUNCTION) needs --dim D, its number of "
                             "parameters")
        params = _key_values(args.param)
        model = from_jax_file(args.model, args.dim, args.data, params)
        title = f"{args.model.rpartition(':')[2]} ({Path(args.model).name}, JAX, D={model.dim})"
        return model, "loaded", title, {"python": args.model, "dim": model.dim,
                                        "data": args.data, "scalars": params}
    if args.dim is not None:
        raise ValueError("--dim is for a JAX model (FILE.py:FUNCTION)")
    if not _is_header(args.model):
        if args.data is not None:
            raise ValueError("--data is for a model header; a registered model takes --param")
        params = _params(args.param, args.model)
        return ({"name": args.model, **params}, args.model, _model_title(args.model, params),
                _model_parameters(args.model, params))

    model = load_model_files(args.model, args.data, _key_values(args.param))
    scalars = {k: v for k, v in model.fields.items() if not isinstance(v, np.ndarray)}
    shapes = {k: list(v.shape) for k, v in model.fields.items() if isinstance(v, np.ndarray)}
    title = (f"{model.model_name} ({model.header.name}, D={model.dim}"
             + "".join(f", {k}={v}" for k, v in scalars.items()) + ")")
    parameters = {"header": str(model.header), "data": args.data, "scalars": scalars,
                  "shapes": shapes}
    return model, model.spec()["model"], title, parameters


def _run(args) -> int:
    model, name, title, parameters = _run_model(args)
    if args.sharpness_every == 0:
        raise ValueError("--sharpness-every must be >= 1: the table and plots show sharpness")
    method = METHODS[args.method]
    # defaults by method: no weight decay where it has none, a unit start on the sphere
    args.wd = args.wd or [2e-4 if method.uses_wd else 0.0]
    args.init_norm = args.init_norm or [1.0 if method.on_sphere else 10.0]
    ds = ps.sweep(model, lr=args.lr, wd=args.wd, seeds=args.seeds, method=method.name,
                  init_norm=args.init_norm, steps=args.steps, record_every=args.record_every,
                  sharpness_every=args.sharpness_every, progress=False)
    identity = json.loads(ds.attrs["pysharp_sweep"])
    settings = identity["settings"]
    every, eos_tol = int(settings["sharpness_every"]), float(settings["eos_tol"])
    # the smallest sharpness from the EoS entry record on (NaN: never entered)
    after = (ds.sharpness_step >= ds.eos_entry_step) & (ds.eos_entry_step >= 0)
    ds["min_sharpness_after_entry"] = ds.sharpness.where(after).min("sharpness_step")
    flat = ds.stack(trajectory=("lr", "wd", "seed", "init_norm"))
    extra = [m for m in REGISTRY[name].summaries if m in ds]
    cols = ["lr", "wd", "seed", "init_norm", "eos_entry_step", "final_sharpness",
            "min_sharpness_after_entry", "final_loss", "final_eff_lr", "diverged"] + extra
    width = {c: max(15, len(c)) for c in cols}
    print("  ".join(f"{c:>{width[c]}s}" for c in cols))
    rows = []
    for t in range(flat.sizes["trajectory"]):
        row = flat.isel(trajectory=t)
        cells, values = [], {}
        for c in cols:
            v = row[c].values.item()
            values[c] = v if isinstance(v, (bool, int)) or np.isfinite(v) else None
            cells.append(f"{v!s:>{width[c]}s}" if isinstance(v, (bool, int))
                         else f"{v:>{width[c]}.6g}")
        rows.append(values)
        print("  ".join(cells))
    print(f"  eos_entry_step: first sharpness record with eff_lr * sharpness >= "
          f"{2 * (1 - eos_tol):g} = 2 (1 - eos_tol), -1: never; sharpness is recorded every "
          f"{every} steps, so entry lies up to {every} steps before it. "
          "min_sharpness_after_entry: the smallest sharpness record from entry on.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"model": name, "model_parameters": parameters, "title": title,
               "method": method.name, "lr": list(args.lr), "wd": list(args.wd),
               "seeds": list(args.seeds),
               "init_norm": list(args.init_norm), "steps": int(settings["steps"]),
               "record_every": int(settings["record_every"]), "sharpness_every": every,
               "eos_tol": eos_tol,
               "eos_entry_definition": "first sharpness record (every sharpness_every steps) "
                                       "with eff_lr * sharpness >= 2 (1 - eos_tol); -1: never",
               "eos_entry_resolution_steps": every, "trajectories": rows}
    fig, ax = _summary_and_axes(out / "run.json", summary, figsize=(14, 4.2))
    if fig is None:
        return 0
    shown = min(flat.sizes["trajectory"], 12)
    for t in range(shown):
        row = flat.isel(trajectory=t)
        name = f"lr {float(row.lr):.3g}, wd {float(row.wd):.2g}" + (
            f", seed {int(row.seed)}" if ds.sizes["seed"] > 1 else "") + (
            f", |w0| {float(row.init_norm):.3g}" if ds.sizes["init_norm"] > 1 else "")
        ax[0].semilogy(ds.step, row.loss, label=name, color=f"C{t % 10}")
        ax[1].plot(ds.sharpness_step, row.eos_ratio, ".-", color=f"C{t % 10}")
        ax[2].plot(ds.sharpness_step, row.sharpness, ".-", color=f"C{t % 10}")
        entry = int(row.eos_entry_step)
        if entry >= 0:
            for a in ax[1:]:
                a.axvline(entry, color=f"C{t % 10}", lw=0.8, ls=":")
    ax[1].axhline(2, color="k", lw=0.8, ls="--")
    ax[0].set(title="training loss", xlabel="step", ylabel="loss")
    ax[1].set(title="eff. LR x spherical sharpness", xlabel="step",
              ylabel=r"$\eta_{\mathrm{eff}}\,\lambda_1$")
    ax[2].set(title="spherical sharpness", xlabel="step", ylabel=r"$\lambda_1$ of $H(w/\|w\|)$")
    from matplotlib.lines import Line2D
    handles, labels = ax[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="0.4", lw=0.8, ls=":"))
    labels.append(f"EoS entry: first record\nat the edge (entry up to\n{every} steps earlier)")
    fig.legend(handles, labels, loc="outside right upper", fontsize=7)
    more = (f" (first {shown} of {flat.sizes['trajectory']} trajectories)"
            if flat.sizes["trajectory"] > shown else "")
    values = ", ".join(f"{label} {' '.join(f'{v:g}' for v in vs)}" for label, vs in (
        ("lr", args.lr), ("wd", args.wd), ("seed", args.seeds), ("||w0||", args.init_norm)))
    fig.suptitle(f"{method.label} on {title}\n{values}; {int(settings['steps'])} steps, "
                 f"sharpness every {every} steps{more}", fontsize=10)
    fig.savefig(out / "run.png", dpi=110)
    _pyplot().close(fig)
    print(f"wrote {out / 'run.png'} and {out / 'run.json'}")
    return 0


def _reproduce(args) -> int:
    if args.name == "all" and args.net is not None:
        raise ValueError("--net is for one experiment (cifar-sharpness), not `pysharp "
                         "reproduce all`")
    if args.name == "all":
        results = reproduce.run_all(args.out, quick=args.quick, workers=args.workers or 1)
        print(f"ran {len(results)} experiments; index at {Path(args.out) / 'index.md'}")
        for name in reproduce.names():
            if name not in results:
                print(f"skipped {name}: {reproduce.missing(name)}")
        print(reproduce.timing_line(reproduce.timing(args.out)))
        return 0
    if args.workers is not None:
        raise ValueError("--workers is for `pysharp reproduce all`; one experiment runs in "
                         "this process")
    options = {} if args.net is None else {"net": args.net}
    summary = reproduce.run(args.name, args.out, quick=args.quick, data=args.data,
                            full=args.full, options=options)
    for key, value in summary.items():
        if not isinstance(value, (list, dict)):
            print(f"  {key}: {value}")
    for line in summary.get("side_by_side", []):
        print(f"  {line}")
    print(f"figures: {', '.join(summary.get('figures', []))} in {args.out}")
    return 0


def _experiments() -> str:
    """The experiments of ``pysharp reproduce``, one line each (for its --help)."""
    lines = ["experiments:"]
    for name in reproduce.names():
        module = importlib.import_module(f"pysharp.reproduce.{reproduce.REGISTRY[name]}")
        lines.append(f"  {name:19s}{textwrap.shorten(module.DESCRIPTION, 60, placeholder=' ...')}")
    lines.append(f"  {'all':19s}every experiment, and OUT/index.md linking their figures")
    return "\n".join(lines)


def _info(args) -> int:
    print(json.dumps({"version": ps.__version__, "core": ps.build_info()}, indent=2))
    try:
        flags = _compiler.build_flags()
        print(f"run-time models (load_model): {flags['compiler']} {' '.join(flags['flags'])}\n"
              f"  headers: {_compiler.include_dir()}; cache: {_compiler.cache_dir()}")
    except (_compiler.ModelCompileError, PermissionError) as exc:
        print(f"run-time models (load_model): unavailable: {exc}")
    print("backends:")
    for name, entry in ps.backends().items():
        state = "available" if entry["available"] else f"missing: {entry['reason']}"
        print(f"  {name:6s} {state}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with negative numbers in any notation (``-2e-4``, ``-.5``) read as values."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _whole(text: str) -> int:
    """argparse type of counts: a whole number, also written as an integral float (1e5)."""
    try:
        return whole_number(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def main(argv: list[str] | None = None) -> int:
    """Run the ``pysharp`` command line on ``argv`` (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0, 2 for a bad argument or missing extra (its message on
        stderr, no traceback), 130 when interrupted (Ctrl-C).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="pysharp", description="pysharp: sharpness and the Edge of Stability "
                     "of GD with weight decay, from the command line.",
                     epilog="Run 'pysharp COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"pysharp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="GD+WD in the paper's BN linear regression setting, "
                                       "and a small lr x wd grid")
    demo.add_argument("--quick", action="store_true",
                      help="20k steps instead of 100k (default folder pysharp-demo/quick)")
    demo.add_argument("--seed", type=_whole, default=0)
    demo.add_argument("--out", help="folder for demo.json, demo.png, demo-sweep.png and the "
                                    "sweep's store (default pysharp-demo, or pysharp-demo/quick "
                                    "with --quick)")
    demo.set_defaults(func=_demo)
    rep = sub.add_parser("reproduce", help="the theory's predictions as figures and numbers",
                         epilog=_experiments(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("name", help="an experiment (listed below), or 'all'")
    rep.add_argument("--out", default="pysharp-figures", help="output folder")
    rep.add_argument("--quick", action="store_true", help="seconds instead of minutes")
    rep.add_argument("--data", metavar="DIR", help="the dataset's files as published (for "
                     "experiments on real data: cifar-sharpness, fashion-stability); nothing is "
                     "downloaded")
    rep.add_argument("--full", action="store_true", help="the paper's own size (a GPU's "
                     "work; for experiments on real data)")
    rep.add_argument("--net", metavar="NET", help="the network, for cifar-sharpness: vgg11 "
                     "(the default) or resnet20 (Lyu et al.'s scale-invariant ResNet-20)")
    rep.add_argument("--workers", type=_whole, metavar="N", help="with 'all': run the "
                     "experiments N at a time in worker processes of one thread each (default "
                     "1: one after another in this process); for machines with cores to spare")
    rep.set_defaults(func=_reproduce)
    sw = sub.add_parser("sweep", help="run a TOML-configured lr x wd x seed x init_norm sweep "
                                      "(lr x batch x ... for SGD) into a resumable Zarr store")
    sw.add_argument("config", help="TOML file (see examples/)")
    sw.add_argument("--method", choices=_method_names(),
                    help="the optimiser (overrides run.method; default gd_wd)")
    sw.add_argument("--batch", type=_whole, nargs="+", metavar="B",
                    help="SGD batch sizes (overrides grid.batch)")
    sw.add_argument("--resume", action="store_true",
                    help="continue an existing store: compute only its missing chunks")
    sw.add_argument("--store", help="store path (default: output.store, else CONFIG.zarr)")
    sw.add_argument("--workers", type=_whole, help="run chunks on N local worker processes")
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
    rn = sub.add_parser("run", help="one batch of GD+WD (or --method) trajectories: a table, "
                                    "run.png and run.json")
    rn.add_argument("model", help="a registered model name (" + ", ".join(_model_names())
                    + "), your model's C++ header (see the 'Your own model' tutorial), or a "
                    "loss written in JAX as FILE.py:FUNCTION (with --dim)")
    rn.add_argument("--data", metavar="FILE.npz",
                    help="a model header's or JAX loss's arrays (numpy.savez), by name")
    rn.add_argument("--dim", type=_whole, help="a JAX loss's number of parameters D")
    rn.add_argument("--param", action="append", metavar="KEY=VALUE",
                    help="model parameter, e.g. d=40 (repeatable)")
    rn.add_argument("--method", default="gd_wd",
                    choices=[name for name, m in METHODS.items() if m.sweep],
                    help="the optimiser (default gd_wd); pgd takes --lr as its constant "
                         "effective LR")
    rn.add_argument("--lr", type=float, nargs="+", default=[0.5])
    rn.add_argument("--wd", type=float, nargs="+",
                    help="weight decays (default 2e-4; 0 for a method without one)")
    rn.add_argument("--seeds", type=_whole, nargs="+", default=[0],
                    help="the seeds themselves (default 0): --seeds 0 1 2 3 runs four, "
                         "--seeds 4 runs seed 4")
    rn.add_argument("--init-norm", type=float, nargs="+",
                    help="initial norms ||w0|| (default 10; 1 for a method on the sphere)")
    rn.add_argument("--steps", type=_whole, default=20_000, help="e.g. 20000 or 2e4")
    rn.add_argument("--record-every", type=_whole, help="loss records (default steps // 100)")
    rn.add_argument("--sharpness-every", type=_whole,
                    help="sharpness records (default steps // 20); EoS entry is known to within "
                         "this many steps")
    rn.add_argument("--out", default="pysharp-run", help="folder for run.png and run.json")
    rn.set_defaults(func=_run)
    info = sub.add_parser("info", help="how the compiled core was built and which backends run")
    info.set_defaults(func=_info)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"\npysharp {args.command}: interrupted", file=sys.stderr)
        return 130
    except SweepDiskFull as exc:  # a store on a full disk: what was kept, no traceback
        print(f"pysharp {args.command}: {exc}", file=sys.stderr)
        return 1
    except (ImportError, ValueError, MemoryError) as exc:  # bad argument, missing extra,
        print(f"pysharp {args.command}: error: {exc}", file=sys.stderr)  # too large: no traceback
        return 2


if __name__ == "__main__":
    sys.exit(main())
