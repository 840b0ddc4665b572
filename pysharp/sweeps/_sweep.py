"""``pysharp.sweep``: a Cartesian grid of GD+WD, projected GD, scalar RMSprop or SGD runs."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Executor, wait
from pathlib import Path
from typing import Any

import numpy as np

from .._backends import resolve
from .._engine.memory import available_memory, cgroup_room  # noqa: F401 - the tests patch them here
from .._engine.methods import ALL_METHODS, ENGINES
from .._engine.validation import as_positive_int, as_real, check_nonzero_rows, check_record_every
from .._version import __version__
from ..models import ScaleInvariantModel
from ..models._kinds import runs_sgd
from ..models._registry import REGISTRY, entry_of
from . import _spec
from ._compute import (
    GRID_DIMS,
    METHOD_DIMS,
    RECORDED,
    SUMMARY_DOC,
    Settings,
    compute_chunk,
    initial_points,
    layout,
    summary_doc,
)
from ._store import FORMAT, SweepStore, block_shape, chunk_bounds, disk_estimate


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


def seeds_axis(seeds, name: str = "seeds", table: bool = False) -> np.ndarray:
    """The seeds of a grid: a 1-D sequence of whole numbers. A bare number is refused: read
    as "this many seeds" or as "this one seed" by as many users, it would run the wrong
    grid for half of them (``table``: say it in the TOML config's words)."""
    if np.ndim(seeds) == 0:
        n = seeds.item() if isinstance(seeds, (np.generic, np.ndarray)) else seeds
        whole = isinstance(n, int) and not isinstance(n, bool) and n >= 0

        def count(k) -> str:
            return f"{{ range = {k} }}" if table else f"range({k})"
        many = (f"{count(n)} for the {n} seeds 0 to {n - 1}" if whole and n > 1
                else f"{count('n')} for the seeds 0 to n - 1")
        one = f"[{n}] for seed {n} alone" if whole else "[s] for seed s alone"
        raise TypeError(f"{name} takes the seeds themselves: {many}, {one}. A bare number "
                        f"({name} = {n!r}) is refused: it reads as a count as readily as a "
                        "seed")
    return _axis(seeds, name, integer=True)


def make_grid(lr, wd, seeds, init_norm, batch=None, method: str = "gd_wd"
              ) -> dict[str, np.ndarray]:
    """The validated grid axes of ``method``, in the order of ``METHOD_DIMS[method]``."""
    spec = ALL_METHODS[method]
    grid = {"lr": _axis(lr, "lr", positive=True), "wd": _axis(wd, "wd"),
            "seed": seeds_axis(seeds),
            "init_norm": _axis(init_norm, "init_norm", positive=True)}
    if "batch" in spec.grid_axes:
        grid["batch"] = _axis(batch, "batch", integer=True)  # bounds: see _check_method
    if grid["lr"].max() * grid["wd"].max() >= 1:
        raise ValueError("lr * wd must be < 1 at every grid point "
                         f"(max lr {grid['lr'].max()} x max wd {grid['wd'].max()})")
    if not spec.uses_wd and grid["wd"].tolist() != [0.0]:
        raise ValueError(f"method={method!r} has no weight decay (the lr axis is its "
                         f"{spec.hyper[0]}): wd must be 0 (the default), got "
                         f"{grid['wd'].tolist()}")
    if spec.on_sphere and grid["init_norm"].tolist() != [1.0]:
        raise ValueError(f"method={method!r} starts on the unit sphere: init_norm must be 1 "
                         f"(the default), got {grid['init_norm'].tolist()}")
    return {d: grid[d] for d in METHOD_DIMS[method]}


def _swept_with(wanted) -> str:
    """The swept methods for which ``wanted(row)`` holds, as "'a' or 'b'"."""
    return " or ".join(repr(name) for name, m in ALL_METHODS.items() if m.sweep and wanted(m))


def _check_method(method, model, grid_batch, *, sharpness_every, jitter, backend,
                  replacement, rms_beta, rms_eps) -> None:
    """Refuse, before any work, a method that does not fit the model or the other arguments."""
    spec = ALL_METHODS[method]
    name = entry_of(model).name
    if spec.engine == "minibatch":
        if not runs_sgd(model):
            fit = sorted(e.name for e in REGISTRY.values() if runs_sgd(e.cls))
            raise ValueError(f"method={method!r} needs a square-loss model or BN linear "
                             f"regression ({', '.join(fit)}); {name!r} is not one")
    elif not isinstance(model, ScaleInvariantModel):
        sgd = _swept_with(lambda m: m.engine == "minibatch")
        raise ValueError(f"method={method!r} needs a scale-invariant model; {name!r} is a "
                         f"square-loss model: use method={sgd}")
    if grid_batch is not None and "batch" not in spec.hyper:
        raise ValueError(f"batch applies to method={_swept_with(lambda m: 'batch' in m.hyper)} "
                         f"only, not {method!r}")
    if replacement is not None and "replacement" not in spec.reads:
        takes = _swept_with(lambda m: "replacement" in m.reads)
        raise ValueError(f"replacement applies to method={takes} only, not {method!r}")
    if sharpness_every and "sharpness_every" not in spec.reads:
        raise ValueError(f"sharpness_every: method={method!r} records no sharpness (leave it "
                         "unset)")
    if jitter and "jitter" not in spec.reads:
        raise ValueError(f"jitter: method={method!r} has no jitter (its noise is the batches')")
    if ENGINES[spec.engine].core_only and backend not in ("auto", "cpp"):
        raise ValueError(f"backend: method={method!r} runs on the compiled core ('cpp'), "
                         f"got {backend!r}")
    if replacement is not None and not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    if "batch" in spec.hyper:
        minimum, why = model.sgd_min_batch
        if grid_batch.min() < minimum:
            raise ValueError(f"batch sizes must be >= {minimum}{why}, got {grid_batch.min()}")
        if not replacement and grid_batch.max() > model.n:
            raise ValueError(f"batch sizes must be <= n = {model.n} without replacement, "
                             f"got {grid_batch.max()}")
    for option, value in (("rms_beta", rms_beta), ("rms_eps", rms_eps)):
        if value is not None and option not in spec.options:
            takes = _swept_with(lambda m, option=option: option in m.options)
            raise ValueError(f"{option} applies to method {takes} only, not {method!r}")


def _default_record_every(steps: int, method: str) -> int:
    """steps // 100 (at least 1); for a method with an adaptive step (scalar RMSprop) the
    largest divisor of steps up to that, so that step T is recorded (see ``sharpness_drop``)."""
    every = max(1, steps // 100)
    if ALL_METHODS[method].adaptive_step:
        while steps % every:
            every -= 1
    return every


def _check_starts(model, grid: dict[str, np.ndarray]) -> None:
    """Refuse, before any work, a seed whose start is zero or where the loss is undefined.

    Scale invariance makes every init_norm give the same loss; only the
    smallest (underflow) and the largest (overflow) can differ, so each seed
    is checked at those two.
    """
    norms = np.array([grid["init_norm"].min(), grid["init_norm"].max()])
    if not isinstance(model, ScaleInvariantModel):  # a square-loss model: any finite w is fine
        norms = norms[-1:].repeat(2)
    for s in grid["seed"]:
        W0 = initial_points(model, np.array([s, s]), norms)
        try:
            if not np.all(np.isfinite(W0)):
                raise ValueError("the start is not finite")
            check_nonzero_rows(W0, "w0")
            if not np.all(np.isfinite(model.loss(W0))):
                raise ValueError("the loss is not finite there")
        except ValueError as exc:
            raise ValueError(f"seeds = {int(s)} with init_norm in [{norms[0]}, {norms[1]}] "
                             f"gives an unusable start: {exc}") from None


@contextlib.contextmanager
def _sigint_deferred():
    """Hold Ctrl-C (SIGINT) back while the store is read or written, then raise it.

    Zarr runs its I/O on an event loop in another thread: a KeyboardInterrupt in this
    thread while it waits for one leaves that loop's tasks pending (asyncio prints "Task
    was destroyed but it is pending!" at exit) and a chunk half-written. Deferred, the
    chunk in hand is written and marked (milliseconds), then the sweep stops. Only in the
    main thread, and only where Python's own handler is installed.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


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


def sweep(model: Any, *, lr, wd=None, seeds=(0,), init_norm=1.0, batch=None,
          method: str = "gd_wd", steps: int, record_every: int | None = None,
          sharpness_every: int | None = None, jitter: float = 0.0, eos_tol: float = 0.05,
          backend: str = "auto", replacement: bool | None = None,
          rms_beta: float | None = None, rms_eps: float | None = None,
          store: str | Path | None = None, executor: Executor | None = None,
          chunk_size: int = 2048, progress: bool = True):
    """``method`` on every point of a grid of hyperparameters, as an xarray Dataset.

    The grid is lr x wd x seeds x init_norm for the scale-invariant methods
    (``"gd_wd"``, ``"pgd"``, ``"scalar_rmsprop"``) and lr x batch x wd x seeds x
    init_norm for ``"sgd"``.

    The grid is laid out flat (C order over lr, wd, seed, init_norm) and cut
    into chunks of at most ``chunk_size`` trajectories, each a block of whole
    rows of the trailing axes (a contiguous range of the flat order); each
    chunk is one engine call (the engine already uses every core), run in this
    process or, with ``executor``, on any ``concurrent.futures.Executor`` (a
    process pool, or ``dask.distributed.Client(...).get_executor()`` for a
    cluster). Results do not depend on the chunking, the executor or the order
    chunks finish in.

    The size of the results is estimated before any work: a sweep whose results
    would not fit in memory is refused at once (``MemoryError`` naming the size)
    unless ``store`` is given, in which case chunks stream to disk and the Dataset
    returned is lazy, so grids far larger than memory run.

    Parameters
    ----------
    model : str, dict or model instance
        A registered synthetic model by name (``"bn_linear_regression"``,
        ``"bn_matrix_completion"``, ``"toy3d"``; for ``"sgd"`` also
        ``"linear_regression"`` and ``"two_layer_net"``) or as a spec dict
        ``{"name": ..., **factory_parameters}``; workers rebuild it from the
        spec. A model instance is shipped as its data (fine for small data); one
        compiled at run time (``load_model``, ``from_jax``) with its compiled
        modules, which every worker loads as they are, whatever its header says
        by then.
    lr, wd : float or 1-D array_like
        Learning rates (> 0) and weight decays (>= 0), lr wd < 1; distinct values.
        ``wd`` is required for ``"gd_wd"`` and ``"scalar_rmsprop"`` and defaults to
        0 otherwise; for ``"pgd"`` ``lr`` is the constant effective LR eta on the
        unit sphere and ``wd`` must be 0.
    seeds : 1-D array_like of int
        The seeds of the starting directions themselves (``range(4)``: seeds 0 to 3;
        ``[4]``: seed 4 alone): w0 = init_norm * the direction of
        ``model.random_point(seed=seed)`` (for a square-loss model the standard
        initialisation's direction). A bare number is refused (TypeError): ``seeds=4``
        reads as four seeds as readily as seed 4. Default: seed 0 alone.
    init_norm : float or 1-D array_like
        Initial norms ||w0|| (> 0); 1 (the unit sphere) for ``"pgd"``.
    batch : int or 1-D array_like of int
        ``"sgd"`` only (required there): batch sizes, in [1, n] ([2, n] for BN
        linear regression; no upper bound with ``replacement``).
    method : {"gd_wd", "pgd", "scalar_rmsprop", "sgd"}
        :func:`pysharp.run_gd_wd`, :func:`pysharp.run_pgd` (constant effective LR),
        :func:`pysharp.run_scalar_rmsprop` or :func:`pysharp.run_sgd`. Part of a
        store's identity.
    steps, record_every, sharpness_every, jitter, eos_tol
        As in :func:`pysharp.run_gd_wd` (defaults: steps // 100 and steps // 20).
        ``"scalar_rmsprop"`` needs record_every to divide steps (its default does).
        ``"sgd"`` records the loss only: no sharpness_every, no jitter.
    backend : str
        The engine's backend (see :func:`pysharp.backends`), resolved once here;
        ``"sgd"`` runs on the compiled core.
    replacement : bool, optional
        ``"sgd"`` only: draw batches with replacement (default False).
    rms_beta, rms_eps : float, optional
        ``"scalar_rmsprop"`` only: its ``beta`` and ``eps`` (defaults 0.99, 1e-12).
    store : path, optional
        A Zarr directory, readable as ``xarray.open_zarr(store)``. Each finished
        chunk is written at once and marked complete with checksums; calling
        again with the same arguments resumes, computing only chunks that are
        missing or fail their checksum. A store made by a different sweep is
        refused, never overwritten; for a model compiled at run time that
        includes its compiled module (its header and every file it includes).
        Only one chunk at a time (per executor worker) is held in memory.
    executor : concurrent.futures.Executor, optional
        Where chunks run (default: one after another in this process). This
        process writes the store, so workers need no shared file system.
    chunk_size : int
        Upper bound on the trajectories per engine call; thousands keep the
        per-call overhead small.
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
        sweep still completes. ``attrs`` hold the sweep's identity as JSON
        (``pysharp_sweep``), ``pysharp_format``, ``backend`` and
        ``chunks_computed`` / ``chunks_reused`` / ``trajectories_computed`` for
        this call (reused chunks are read from the store, not computed). With
        ``store`` the Dataset is lazy (dask-backed when dask is installed):
        values are read from the store when used.

        For ``"sgd"``: dimensions (lr, batch, wd, seed, init_norm) and ``step``;
        the recorded full-batch ``loss`` and ``final_loss``, ``diverged``,
        ``diverged_step``, ``rho_T2`` (the spectral radius of the second-moment
        operator of linearised SGD at the final iterate, for the point's lr and
        batch: :func:`pysharp.stability.second_moment_operator`) and ``stable``
        (rho_T2 <= 1, the exact linear-stability verdict at an interpolating
        minimum), with the model's own summaries. A ``lr x batch`` map:
        ``pysharp.sweeps.plot(ds, x="lr", y="batch", metric="rho_T2")``.

    Raises
    ------
    MemoryError
        Before any work, when the results (without ``store``) or one chunk would
        not fit in the memory available.
    ValueError
        Naming the argument, before any work: among others when ``record_every >
        steps``, and when the store's estimated size on disk (its files and folders in
        whole blocks of the file system, the data uncompressed) exceeds the free space
        there, or its files the free inodes (both numbers named).
    StoreMismatch
        When ``store`` holds a different sweep, or one of a model compiled from a
        header (or files it includes) that has changed since.
    SweepInterrupted
        On Ctrl-C (a ``KeyboardInterrupt``): how many chunks were finished, and kept
        in ``store``, of how many.
    SweepDiskFull
        When the store's disk fills all the same (an ``OSError``, ENOSPC): likewise
        how many chunks were kept; the same call resumes once space is freed.

    Notes
    -----
    Needs the ``sweep`` extra (xarray; zarr and dask for ``store``; tqdm for the bar).
    Use :func:`pysharp.run_gd_wd` directly for a handful of trajectories.

    Examples
    --------
    >>> import pysharp as ps
    >>> ds = ps.sweep("bn_linear_regression", lr=[0.1, 0.5], wd=[1e-4, 2e-4], steps=2000,
    ...               progress=False)
    >>> dict(ds.eos_entry_step.sizes)
    {'lr': 2, 'wd': 2, 'seed': 1, 'init_norm': 1}
    >>> ds.eos_entry_step.sel(seed=0, init_norm=1.0).values.tolist()  # -1: never
    [[-1, -1], [0, 0]]
    """
    xr = _need("xarray")
    if not isinstance(method, str) or method not in METHOD_DIMS:
        raise ValueError(f"method must be one of {sorted(METHOD_DIMS)}, got {method!r}")
    row = ALL_METHODS[method]
    spec = _spec.normalise(model)
    if wd is None:
        if "wd" in row.required:
            raise ValueError(f"wd is required for method={method!r}")
        wd = 0.0
    if batch is None and "batch" in row.required:
        raise ValueError(f"batch is required for method={method!r} (a batch size or a list of "
                         "them)")
    grid_batch = None if batch is None else _axis(batch, "batch", integer=True)
    _check_method(method, _spec.cached(spec), grid_batch, sharpness_every=sharpness_every,
                  jitter=jitter, backend=backend, replacement=replacement,
                  rms_beta=rms_beta, rms_eps=rms_eps)
    grid = make_grid(lr, wd, seeds, init_norm, batch, method)
    steps = as_positive_int(steps, "steps")
    record_every = as_positive_int(record_every if record_every is not None
                                   else _default_record_every(steps, method), "record_every")
    check_record_every(record_every, steps)
    extra: dict[str, Any] = {}
    if row.adaptive_step and steps % record_every:
        raise ValueError(f"record_every = {record_every} must divide steps = {steps} for "
                         f"method={method!r}: the end sharpness takes one more step, whose "
                         "size is read from eff_lr recorded at the last step")
    if "rms_beta" in row.options:
        beta = as_real(0.99 if rms_beta is None else rms_beta, "rms_beta", minimum=0.0)
        if beta >= 1:
            raise ValueError(f"rms_beta must be < 1, got {beta}")
        extra = {"rms_beta": beta,
                 "rms_eps": as_real(1e-12 if rms_eps is None else rms_eps, "rms_eps",
                                    minimum=0.0)}
    if "replacement" in row.reads:
        extra = {"replacement": bool(replacement)}
    if "sharpness_every" not in row.reads:
        sharpness_every = 0
    settings = Settings(
        steps=steps, record_every=record_every,
        sharpness_every=as_positive_int(sharpness_every if sharpness_every is not None
                                        else max(1, steps // 20), "sharpness_every", minimum=0),
        jitter=as_real(jitter, "jitter", minimum=0.0),
        eos_tol=as_real(eos_tol, "eos_tol", minimum=0.0),
        backend="cpp" if ENGINES[row.engine].core_only else resolve(
            backend, trajectories=True, model=_spec.cached(spec)),
        method=method, **extra)
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
    docs = summary_doc(_spec.cached(spec), method)
    dims = settings.dims
    shape = tuple(len(grid[d]) for d in dims)
    n_traj = math.prod(shape)
    room_for = check_memory(out_layout, shape, chunk_size, in_memory=store is None)
    coords = coordinates(grid, settings)
    if store is not None:
        check_disk(out_layout, shape, store, chunk_size=chunk_size,
                   coord_sizes=[len(v) for v in coords.values()])
    bounds = chunk_bounds(shape, chunk_size)  # computed on demand: no list of 1e7 tuples
    n_chunks = len(bounds)
    identity = json.loads(json.dumps({
        "model": _spec.describe(spec), "grid": {d: grid[d].tolist() for d in dims},
        "settings": settings.identity(), "method": method, "chunk_size": chunk_size,
        "outputs": {name: [list(tail), dtype] for name, (tail, dtype) in out_layout.items()},
        "pysharp_version": __version__}))
    attrs = dataset_attrs(identity, settings)

    data: dict[str, np.ndarray] = {}
    done = np.zeros(n_chunks, dtype=bool)  # the per-chunk bookkeeping: _PER_CHUNK bytes each
    db = None
    if store is None:
        data = {name: np.empty((n_traj, *tail), dtype=dtype)
                for name, (tail, dtype) in out_layout.items()}
    else:
        _need("zarr")
        try:
            with _sigint_deferred():
                db = SweepStore(store, identity, variables(out_layout, docs, settings), coords,
                                dims, chunk_size, attrs, source=_spec.source(identity["model"]))
        except OSError as exc:
            if not _disk_full(exc):
                raise
            raise SweepDiskFull(0, n_chunks, store) from exc
        for k in db.marked():
            with _sigint_deferred():
                if db.read(k) is not None:  # verified, then dropped
                    done[k] = True
    reused = int(done.sum())
    todo = np.flatnonzero(~done)
    reused_traj = bounds.trajectories(np.flatnonzero(done))
    bar = _Progress(progress, n_traj, reused_traj)

    def finished(k: int, result: dict) -> None:
        with _sigint_deferred():  # a chunk is kept and counted whole, or not at all
            start, stop = bounds[k]
            if db is not None:
                db.write(k, result)
            else:
                for name, arr in data.items():
                    arr[start:stop] = result[name]
            done[k] = True
            bar.update(stop - start)

    failed: dict[int, BaseException] = {}
    pending: dict = {}
    try:
        if executor is None:
            for k in map(int, todo):
                finished(k, compute_chunk(spec, grid, settings, *bounds[k]))
        else:
            # at most `window` results wait in this process at once
            window = len(todo) if room_for is None else max(1, min(len(todo), room_for))
            queue = map(int, todo)
            k = next(queue, None)
            while k is not None or pending:
                while k is not None and len(pending) < window:
                    pending[executor.submit(compute_chunk, spec, grid, settings, *bounds[k])] = k
                    k = next(queue, None)
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    j = pending.pop(fut)
                    try:
                        result = fut.result()
                    except Exception as exc:  # noqa: BLE001 - others still finish and are kept
                        failed[j] = exc
                        continue
                    finished(j, result)  # a full disk stops the sweep: below
    except KeyboardInterrupt:
        for fut in pending:
            fut.cancel()
        raise SweepInterrupted(int(done.sum()), n_chunks, store, reused) from None
    except OSError as exc:
        if db is None or not _disk_full(exc):
            raise
        for fut in pending:
            fut.cancel()
        raise SweepDiskFull(int(done.sum()), n_chunks, store, reused) from exc
    finally:
        bar.close()
    if failed:
        k, exc = min(failed.items())
        kept = f"; the {int(done.sum())} finished chunks are in {store}" if db else ""
        raise RuntimeError(f"{len(failed)} of {n_chunks} chunks failed (first: chunk {k}, "
                           f"trajectories {bounds[k][0]}..{bounds[k][1] - 1}: {exc!r}){kept}; "
                           "re-run the same call to compute only what is missing") from exc

    if db is not None:
        ds = open_lazy(xr, store)
    else:
        ds = to_dataset(xr, data, grid, settings, attrs, docs)
    ds.attrs.update(chunks_computed=len(todo), chunks_reused=reused,
                    trajectories_computed=n_traj - reused_traj)
    return ds


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the user's quota is full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _kept(done: int, n_chunks: int, store, then: str = "") -> str:
    """What a stopped sweep kept, and how to continue (after ``then``)."""
    return (f"{done} of {n_chunks} chunks saved to {store}; {then}the same call (same "
            "arguments and store) computes only the missing ones")


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C (SIGINT); says what was kept.

    A ``KeyboardInterrupt``, so code that does not know it still stops as before.

    Attributes
    ----------
    done : int
        Chunks finished (kept in ``store``, if any), reused ones included.
    n_chunks : int
        Chunks of the whole sweep.
    store : str, Path or None
        The store holding the finished chunks (None: nothing was kept).
    reused : int
        Of ``done``, the chunks already in the store when the call began.
    """

    def __init__(self, done: int, n_chunks: int, store, reused: int = 0) -> None:
        self.done, self.n_chunks, self.store, self.reused = done, n_chunks, store, reused
        super().__init__(self.message())

    def message(self) -> str:
        """One line: what was saved and how to continue."""
        if self.store is None:
            return (f"interrupted after {self.done} of {self.n_chunks} chunks; without a store "
                    "nothing was kept")
        return f"interrupted: {_kept(self.done, self.n_chunks, self.store)}"


class SweepDiskFull(OSError):
    """A sweep stopped because its store's disk (or the user's quota) is full; says what
    was kept.

    An ``OSError`` with ``errno.ENOSPC``. The chunk being written when the disk filled
    has no marker, so it counts as missing and is computed again.

    Attributes
    ----------
    done, n_chunks, store, reused
        As for :class:`SweepInterrupted`.
    """

    def __init__(self, done: int, n_chunks: int, store, reused: int = 0) -> None:
        self.done, self.n_chunks, self.store, self.reused = done, n_chunks, store, reused
        super().__init__(errno.ENOSPC, self.message())

    def message(self) -> str:
        """One line: what was saved and how to continue."""
        kept = _kept(self.done, self.n_chunks, self.store, "free some space, then ")
        return f"the disk holding {self.store} is full: {kept}"

    def __str__(self) -> str:
        return self.message()


#: Memory needed while one chunk runs, in units of the chunk's outputs: the engine's
#: record buffers, the transposed copies ``summarise`` makes, and the result in transit.
_CHUNK_WORK = 3
#: Bytes a sweep holds per chunk besides its results: the chunk's done flag and its index
#: in the list of chunks to compute (the chunks' bounds are computed on demand).
_PER_CHUNK = 9
#: Fraction of the available memory a sweep may plan to use.
_SAFETY = 0.5


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def check_memory(out_layout: dict, shape: tuple[int, ...], chunk_size: int, *,
                 in_memory: bool, available: int | None = None) -> int | None:
    """Refuse, before any work, a sweep whose results or chunks would not fit in memory.

    Parameters
    ----------
    out_layout : dict
        name -> (shape after the trajectory axis, dtype), see ``_compute.layout``.
    shape : tuple of int
        The grid's shape.
    chunk_size : int
        Upper bound on the trajectories per chunk.
    in_memory : bool
        True when the whole result is held in memory (no ``store``).
    available : int, optional
        Bytes available (default: :func:`available_memory`).

    Returns
    -------
    int or None
        How many chunk results may wait in this process at once (None: unknown).

    Raises
    ------
    MemoryError
        Naming the size needed, the memory available and what to change. Counted:
        the results (in memory), the per-chunk bookkeeping (``_PER_CHUNK`` bytes a
        chunk) and the chunks at work. Nothing is allocated before the check.
    """
    per_traj = sum(math.prod(tail) * np.dtype(dtype).itemsize
                   for tail, dtype in out_layout.values())
    n_traj = math.prod(shape)
    n_chunks = len(chunk_bounds(shape, chunk_size))
    chunk = _CHUNK_WORK * math.prod(block_shape(shape, chunk_size)) * per_traj
    book = _PER_CHUNK * n_chunks
    total = (n_traj * per_traj if in_memory else 0) + book
    if available is None:
        available = available_memory()
    if available is None:
        return None
    room = _SAFETY * available
    if total + chunk > room and book > max(chunk, total - book):  # the chunks' count is at fault
        raise MemoryError(
            f"the sweep's {n_chunks} chunks need {_bytes(book)} of bookkeeping "
            f"({_PER_CHUNK} B a chunk), more than {_SAFETY:.0%} of the {_bytes(available)} "
            "available with the rest: raise chunk_size (fewer, larger chunks) or shrink the grid")
    if in_memory and total + chunk > room:
        raise MemoryError(
            f"the sweep's results need {_bytes(total - book)} in memory ({n_traj} trajectories "
            f"x {_bytes(per_traj)}), more than {_SAFETY:.0%} of the {_bytes(available)} "
            "available: pass store='sweep.zarr' to stream the chunks to disk (the Dataset "
            "returned is then lazy, read from the store on demand), or record less often "
            "(record_every, sharpness_every)")
    if chunk > room - total:
        raise MemoryError(
            f"one chunk of up to {math.prod(block_shape(shape, chunk_size))} trajectories needs "
            f"about {_bytes(chunk)} while it runs, more than {_SAFETY:.0%} of the "
            f"{_bytes(available)} available{' besides the results' if in_memory else ''}: "
            "lower chunk_size or record less often (record_every, sharpness_every)")
    return int((room - total) // chunk)


def _markers(store: Path) -> int:
    """How many completion markers a store holds (0: none, or no store)."""
    try:
        with os.scandir(store / "_pysharp_done") as entries:
            return sum(1 for e in entries if e.name.endswith(".json") and e.name[:-5].isdigit())
    except OSError:
        return 0


def check_disk(out_layout: dict, shape: tuple[int, ...], store, *, chunk_size: int,
               coord_sizes=(), free: int | None = None, block: int | None = None,
               inodes: int | None = None) -> None:
    """Refuse, before any work, a store that would not fit on its disk.

    The store's size is estimated from its layout (:func:`~._store.disk_estimate`):
    every chunk writes a file per output and a marker under nested folders, each
    taking whole blocks of the file system, so a sweep of many small chunks needs far
    more than its numbers' bytes.

    Parameters
    ----------
    out_layout : dict
        name -> (shape after the trajectory axis, dtype), see ``_compute.layout``.
    shape : tuple of int
        The grid's shape.
    store : str or Path
        The store's directory (need not exist yet: its nearest existing parent is
        measured). Resumed, only its chunks without a marker are counted.
    chunk_size : int
        Upper bound on the trajectories per chunk.
    coord_sizes : iterable of int
        The lengths of the coordinate arrays.
    free, block, inodes : int, optional
        Bytes free on that disk (default: ``shutil.disk_usage``), its allocation unit
        (``os.statvfs``'s ``f_frsize``) and its free inodes (``f_favail``; None: no
        limit, as on file systems that report none).

    Raises
    ------
    ValueError
        Naming the estimated size and the free space (or the files and the free
        inodes) when the first exceeds the second.
    """
    import shutil

    path = Path(store).absolute()
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    if free is None:
        free = shutil.disk_usage(where).free
    if block is None or inodes is None:
        try:
            st = os.statvfs(where)
        except (OSError, AttributeError):  # no statvfs (Windows): 4 KiB blocks, no inodes
            st = None
        if block is None:
            block = (st.f_frsize or st.f_bsize) if st is not None else 4096
        if inodes is None and st is not None and st.f_files:
            inodes = st.f_favail
    need, files, n_chunks = disk_estimate(out_layout, shape, chunk_size, block, coord_sizes)
    left = n_chunks - min(_markers(path), n_chunks)
    if left < n_chunks:  # resumed: its metadata and finished chunks are on disk already
        need, files = need * left // n_chunks, files * left // n_chunks
    what = (f"{math.prod(shape)} trajectories in {n_chunks} chunks"
            + (f", {left} still to write" if left < n_chunks else ""))
    advice = ("raise chunk_size (each chunk writes a file per output, however small), record "
              "less often (record_every, sharpness_every), shrink the grid, or choose a store "
              "on a larger disk")
    if need > free:
        raise ValueError(
            f"store {store}: the sweep's results need about {_bytes(need)} on disk ({what}: "
            f"{files} files and folders of whole {block}-byte blocks, the data "
            f"uncompressed), but only {_bytes(free)} are free there: {advice}")
    if inodes is not None and files > inodes:
        raise ValueError(
            f"store {store}: the sweep needs about {files} files and folders ({what}), but "
            f"only {inodes} more can be made on that disk (free inodes): {advice}")


def variables(out_layout: dict, docs: dict | None = None, settings: Settings | None = None
              ) -> dict[str, tuple[tuple[str, ...], str, dict]]:
    """name -> (dims, dtype, attrs) of every output of a sweep; ``docs`` (name ->
    description, default the generic summaries') from ``summary_doc(model, method)``;
    ``settings`` give the method's grid axes (default GD+WD's)."""
    docs = SUMMARY_DOC if docs is None else docs
    dims = GRID_DIMS if settings is None else settings.dims
    recorded = RECORDED if settings is None else settings.recorded
    return {name: (dims + ((recorded[name],) if name in recorded else ()), dtype,
                   {"description": docs.get(
                       name, f"recorded {name} (see pysharp.Trajectory)")})
            for name, (_, dtype) in out_layout.items()}


def coordinates(grid: dict, settings: Settings) -> dict[str, np.ndarray]:
    """The Dataset's coordinates: the grid axes (in ``settings.dims`` order), then the record
    axes (``step`` only for SGD)."""
    coords = {d: np.asarray(grid[d]) for d in settings.dims}
    steps = settings.record_steps()
    coords.update({axis: steps[axis] for axis in dict.fromkeys(settings.recorded.values())})
    return coords


def dataset_attrs(identity: dict, settings: Settings) -> dict[str, str]:
    """The Dataset's (and the store group's) attributes."""
    return {"pysharp_format": FORMAT, "pysharp_sweep": json.dumps(identity),
            "backend": settings.backend}


def open_lazy(xr, store):
    """The store as a lazy Dataset: dask arrays, one dask chunk per stored chunk when dask is
    installed, else xarray's lazily indexed arrays."""
    try:
        import dask  # noqa: F401
        chunks: dict | None = {}
    except ImportError:
        chunks = None
    return xr.open_zarr(store, chunks=chunks, consolidated=False, zarr_format=3)


def to_dataset(xr, data: dict[str, np.ndarray], grid: dict, settings: Settings, attrs: dict,
               docs: dict | None = None):
    """Reshape flat per-trajectory arrays (leading axis: the flat grid) onto the grid's axes."""
    shape = tuple(len(grid[d]) for d in settings.dims)
    out = {}
    for name, (dims, _, var_attrs) in variables(
            {name: (arr.shape[1:], arr.dtype.name) for name, arr in data.items()}, docs,
            settings).items():
        arr = data[name]
        out[name] = xr.Variable(dims, arr.reshape(shape + arr.shape[1:]), var_attrs)
    return xr.Dataset(out, coords=coordinates(grid, settings), attrs=dict(attrs))


def open_sweep(store: str | Path):
    """The Dataset of a finished sweep store (as ``sweep`` returned it), without recomputing.

    Every chunk's checksums are verified first, one chunk at a time; the Dataset
    returned is lazy (see :func:`sweep`). ``xarray.open_zarr(store)`` returns the
    same Dataset without this check.

    Parameters
    ----------
    store : str or Path
        The directory a ``sweep(..., store=...)`` call wrote.

    Returns
    -------
    xarray.Dataset
        Lazy (dask-backed when dask is installed); ``.load()`` reads it into memory.

    Raises
    ------
    ValueError
        When the path is not a sweep store, and naming the missing chunks when the
        sweep is unfinished (re-run it to complete) or a chunk fails its checksum.
    """
    xr = _need("xarray")
    zarr = _need("zarr")
    path = Path(store)
    if not path.exists():
        raise ValueError(f"no sweep store at {path}")
    try:
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except Exception as exc:  # noqa: BLE001 - any unreadable directory is refused alike
        raise ValueError(f"{path} is not a Zarr store ({exc})") from None
    if attrs.get("pysharp_format") != FORMAT:
        raise ValueError(f"{path} is not a pysharp sweep store (format {FORMAT})")
    identity = json.loads(attrs["pysharp_sweep"])
    grid = {d: np.asarray(v) for d, v in identity["grid"].items()}
    settings = Settings(**identity["settings"], method=identity.get("method", "gd_wd"))
    out_layout = {name: (tuple(tail), dtype) for name, (tail, dtype) in identity["outputs"].items()}
    db = SweepStore(path, identity, variables(out_layout, None, settings),
                    coordinates(grid, settings), settings.dims, identity["chunk_size"], attrs,
                    create=False, source=_spec.source(identity["model"]))
    marked = np.zeros(db.n_chunks, dtype=bool)
    for k in db.marked():
        marked[k] = True
    missing = [k for k in range(db.n_chunks)
               if not marked[k] or db.read(k, forget=False) is None]
    if missing:
        raise ValueError(f"{path}: {len(missing)} of {db.n_chunks} chunks are missing or failed "
                         "their checksum" + (" or were computed by another model source"
                                             if db.source is not None else "")
                         + f" (first: {missing[:5]}); re-run the sweep to complete it")
    return open_lazy(xr, path)
