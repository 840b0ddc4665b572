"""``pysharp.sweep``: a Cartesian lr x wd x seed x init_norm grid of GD+WD runs."""

from __future__ import annotations

import json
import sys
from concurrent.futures import Executor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from .._dispatch import resolve
from .._validation import as_positive_int, as_real, check_nonzero_rows
from . import _spec
from ._compute import (GRID_DIMS, RECORDED, SUMMARY_DOC, Settings, compute_chunk,
                       initial_points, layout)
from ._store import SweepStore, chunk_bounds


def _need(module: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"pysharp.sweep needs {module}: pip install 'pysharp[sweep]'") from None


def _axis(values, name: str, *, integer: bool = False, positive: bool = False) -> np.ndarray:
    a = np.atleast_1d(np.asarray(values))
    if a.ndim != 1:
        raise ValueError(f"{name} must be a scalar or a 1-D list of values, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty: the grid would have no points")
    if a.dtype.kind not in "iuf" or a.dtype.kind == "b":
        raise TypeError(f"{name} must hold numbers, got dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    if integer:
        # compared as Python numbers: a cast of 1e19 or 2**64 to int64 would wrap around
        if np.any(a != np.round(a)) or any(not 0 <= int(x) < 2**63 for x in a.tolist()):
            raise ValueError(f"{name} must hold whole numbers in [0, 2**63)")
        a = a.astype(np.int64)
    else:
        a = a.astype(np.float64)
        if positive and np.any(a <= 0):
            raise ValueError(f"{name} must be > 0, got {a.min()}")
        if np.any(a < 0):
            raise ValueError(f"{name} must be >= 0, got {a.min()}")
    if np.unique(a).size != a.size:
        raise ValueError(f"{name} has repeated values; each grid value must be distinct")
    return a


def make_grid(lr, wd, seeds, init_norm) -> dict[str, np.ndarray]:
    """The validated grid axes, in the order of ``GRID_DIMS``."""
    grid = {"lr": _axis(lr, "lr", positive=True), "wd": _axis(wd, "wd"),
            "seed": _axis(seeds, "seeds", integer=True),
            "init_norm": _axis(init_norm, "init_norm", positive=True)}
    if grid["lr"].max() * grid["wd"].max() >= 1:
        raise ValueError("lr * wd must be < 1 at every grid point "
                         f"(max lr {grid['lr'].max()} x max wd {grid['wd'].max()})")
    return grid


def _check_starts(model, grid: dict[str, np.ndarray]) -> None:
    """Refuse, before any work, a seed whose start is zero or where the loss is undefined.

    Scale invariance makes every init_norm give the same loss; only the
    smallest (underflow) and the largest (overflow) can differ, so each seed
    is checked at those two.
    """
    norms = np.array([grid["init_norm"].min(), grid["init_norm"].max()])
    for s in grid["seed"]:
        W0 = initial_points(model, np.array([s, s]), norms)
        try:
            if not np.all(np.isfinite(W0)):
                raise ValueError("the start is not finite")
            check_nonzero_rows(W0, "w0")
            model.loss(W0)
        except ValueError as exc:
            raise ValueError(f"seeds = {int(s)} with init_norm in [{norms[0]}, {norms[1]}] "
                             f"gives an unusable start: {exc}") from None


class _Progress:
    """tqdm bar in trajectories (with rate and ETA) on a terminal, else nothing."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, initial=initial, unit="traj", unit_scale=True,
                            desc="sweep", smoothing=0.1)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def sweep(model: Any, *, lr, wd, seeds=0, init_norm=1.0, steps: int,
          record_every: int | None = None, sharpness_every: int | None = None,
          jitter: float = 0.0, eos_tol: float = 0.05, backend: str = "auto",
          store: str | Path | None = None, executor: Executor | None = None,
          chunk_size: int = 2048, progress: bool = True):
    """GD+WD on every point of the grid lr x wd x seeds x init_norm, as an xarray Dataset.

    The grid is laid out flat (C order over lr, wd, seed, init_norm) and cut
    into chunks of ``chunk_size`` trajectories; each chunk is one engine call
    (the engine already uses every core), run in this process or, with
    ``executor``, on any ``concurrent.futures.Executor`` (a process pool, or
    ``dask.distributed.Client(...).get_executor()`` for a cluster). Results
    do not depend on the chunking, the executor or the order chunks finish in.

    Parameters
    ----------
    model : str, dict or ScaleInvariantModel
        A registered synthetic model by name (``"bn_linear_regression"``,
        ``"bn_matrix_completion"``, ``"toy3d"``) or as a spec dict
        ``{"name": ..., **factory_parameters}``; workers rebuild it from the
        spec. A model instance is shipped as its data (fine for small data).
    lr, wd : float or 1-D array_like
        Learning rates (> 0) and weight decays (>= 0), lr wd < 1; distinct values.
    seeds : int or 1-D array_like of int
        Seeds of the starting directions: w0 = init_norm * the direction of
        ``model.random_point(seed=seed)``.
    init_norm : float or 1-D array_like
        Initial norms ||w0|| (> 0).
    steps, record_every, sharpness_every, jitter, eos_tol
        As in :func:`pysharp.run_gd_wd` (defaults: steps // 100 and steps // 20).
    backend : str
        The engine's backend (see :func:`pysharp.backends`), resolved once here.
    store : path, optional
        A Zarr directory. Each finished chunk is written at once and marked
        complete with checksums; calling again with the same arguments resumes,
        computing only chunks that are missing or fail their checksum. A store
        made by a different sweep is refused, never overwritten.
    executor : concurrent.futures.Executor, optional
        Where chunks run (default: one after another in this process). This
        process writes the store, so workers need no shared file system.
    chunk_size : int
        Trajectories per engine call; thousands keep the per-call overhead small.
    progress : bool
        A tqdm bar (trajectories/s, ETA) when stderr is a terminal.

    Returns
    -------
    xarray.Dataset
        Dimensions (lr, wd, seed, init_norm) and the record axes ``step`` and
        ``sharpness_step``: recorded ``loss``, ``norm2``, ``eff_lr``,
        ``sharpness``, ``eos_ratio`` and per-trajectory summaries (see each
        variable's ``description`` attribute): ``eos_entry_step``,
        ``final_sharpness``, ``min_sharpness``, ``final_loss``, ``diverged``,
        ``diverged_step``, ``final_eff_lr``, and ``cosine_min_norm`` (BN linear
        regression) or ``test_loss`` and ``sv_gap`` (matrix completion). A
        diverged point is flagged (``diverged``), its later records NaN; the
        sweep still completes. ``attrs`` hold the sweep's identity as JSON and
        ``chunks_computed`` / ``chunks_reused`` for this call.

    Notes
    -----
    Needs the ``sweep`` extra (xarray; zarr for ``store``; tqdm for the bar).
    Use :func:`pysharp.run_gd_wd` directly for a handful of trajectories.
    """
    xr = _need("xarray")
    spec = _spec.normalise(model)
    grid = make_grid(lr, wd, seeds, init_norm)
    steps = as_positive_int(steps, "steps")
    settings = Settings(
        steps=steps,
        record_every=as_positive_int(record_every if record_every is not None
                                     else max(1, steps // 100), "record_every"),
        sharpness_every=as_positive_int(sharpness_every if sharpness_every is not None
                                        else max(1, steps // 20), "sharpness_every", minimum=0),
        jitter=as_real(jitter, "jitter", minimum=0.0),
        eos_tol=as_real(eos_tol, "eos_tol", minimum=0.0),
        backend=resolve(backend, trajectories=True))
    chunk_size = as_positive_int(chunk_size, "chunk_size")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError("executor must be a concurrent.futures.Executor, e.g. "
                        "dask.distributed.Client(...).get_executor()")
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    if store is not None:
        if not isinstance(store, (str, Path)) or not str(store):
            raise TypeError(f"store must be a path (str or pathlib.Path), got {store!r}")
        if Path(store).exists() and not Path(store).is_dir():
            raise ValueError(f"store: {store} exists and is not a directory")
    _check_starts(_spec.cached(spec), grid)
    out_layout = layout(_spec.cached(spec), settings)
    n_traj = int(np.prod([len(grid[d]) for d in GRID_DIMS]))
    bounds = chunk_bounds(n_traj, chunk_size)
    n_chunks = len(bounds)
    from .. import __version__
    identity = json.loads(json.dumps({
        "model": _spec.describe(spec), "grid": {d: grid[d].tolist() for d in GRID_DIMS},
        "settings": settings.__dict__, "method": "gd_wd", "chunk_size": chunk_size,
        "outputs": {name: [list(tail), dtype] for name, (tail, dtype) in out_layout.items()},
        "pysharp_version": __version__}))

    results: dict[int, dict[str, np.ndarray]] = {}
    db = None
    if store is not None:
        _need("zarr")
        db = SweepStore(store, identity, out_layout, n_traj, chunk_size)
        for k in db.marked():
            got = db.read(k)
            if got is not None:
                results[k] = got
    reused = len(results)
    todo = [k for k in range(n_chunks) if k not in results]
    bar = _Progress(progress, n_traj, sum(b - a for k, (a, b) in enumerate(bounds) if k in results))

    def finished(k: int, result: dict) -> None:
        results[k] = result
        if db is not None:
            db.write(k, result)
        bar.update(bounds[k][1] - bounds[k][0])

    failed: dict[int, BaseException] = {}
    try:
        if executor is None:
            for k in todo:
                finished(k, compute_chunk(spec, grid, settings, *bounds[k]))
        else:
            futures = {executor.submit(compute_chunk, spec, grid, settings, *bounds[k]): k
                       for k in todo}
            for fut in as_completed(futures):
                k = futures[fut]
                try:
                    finished(k, fut.result())
                except Exception as exc:  # noqa: BLE001 - others still finish and are kept
                    failed[k] = exc
    finally:
        bar.close()
    if failed:
        k, exc = min(failed.items())
        kept = f"; the {len(results)} finished chunks are in {store}" if db else ""
        raise RuntimeError(f"{len(failed)} of {n_chunks} chunks failed (first: chunk {k}, "
                           f"trajectories {bounds[k][0]}..{bounds[k][1] - 1}: {exc!r}){kept}; "
                           "re-run the same call to compute only what is missing") from exc

    data = {name: np.concatenate([results[k][name] for k in range(n_chunks)])
            for name in out_layout}
    ds = to_dataset(xr, data, grid, settings, identity)
    ds.attrs.update(chunks_computed=len(todo), chunks_reused=reused)
    return ds


def to_dataset(xr, data: dict[str, np.ndarray], grid: dict, settings: Settings, identity: dict):
    """Reshape flat per-trajectory arrays onto the grid's axes."""
    shape = tuple(len(grid[d]) for d in GRID_DIMS)
    coords: dict[str, Any] = {d: grid[d] for d in GRID_DIMS}
    coords.update(settings.record_steps())
    variables = {}
    for name, arr in data.items():
        dims = GRID_DIMS + ((RECORDED[name],) if name in RECORDED else ())
        attrs = {"description": SUMMARY_DOC.get(name, f"recorded {name} (see pysharp.Trajectory)")}
        variables[name] = xr.Variable(dims, arr.reshape(shape + arr.shape[1:]), attrs)
    return xr.Dataset(variables, coords=coords,
                      attrs={"pysharp_sweep": json.dumps(identity),
                             "backend": settings.backend})


def open_sweep(store: str | Path):
    """The Dataset of a finished sweep store (as ``sweep`` returned it), without recomputing.

    Raises ValueError naming the missing chunks when the sweep is unfinished
    (re-run it to complete) and when a chunk fails its checksum.
    """
    xr = _need("xarray")
    zarr = _need("zarr")
    path = Path(store)
    if not path.exists():
        raise ValueError(f"no sweep store at {path}")
    attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    identity = attrs.get("identity")
    if identity is None:
        raise ValueError(f"{path} is not a pysharp sweep store")
    grid = {d: np.asarray(v) for d, v in identity["grid"].items()}
    settings = Settings(**identity["settings"])
    out_layout = {name: (tuple(tail), dtype) for name, (tail, dtype) in identity["outputs"].items()}
    n_traj = int(np.prod([len(grid[d]) for d in GRID_DIMS]))
    db = SweepStore(path, identity, out_layout, n_traj, identity["chunk_size"])
    chunks = [db.read(k) for k in range(db.n_chunks)]
    missing = [k for k, c in enumerate(chunks) if c is None]
    if missing:
        raise ValueError(f"{path}: {len(missing)} of {db.n_chunks} chunks are missing or failed "
                         f"their checksum (first: {missing[:5]}); re-run the sweep to complete it")
    data = {name: np.concatenate([c[name] for c in chunks]) for name in out_layout}
    return to_dataset(xr, data, grid, settings, identity)
