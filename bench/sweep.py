"""Sweep benchmark: pysharp.sweep against the raw engine calls it makes, in-process and on dask.

BN linear regression (d 40, n 20), a 64 x 64 log-spaced lr x wd grid x 4 seeds
(16384 trajectories), 10^4 steps, sharpness every 500 steps. Rows:

- raw engine: the same chunks as ``run_gd_wd`` calls on precomputed starts,
  nothing else (the floor sweep() is measured against);
- sweep(): in-process, without and with a Zarr store;
- sweep() on a 2-worker ``dask.distributed.LocalCluster`` (each worker's
  engine gets half the cores), when distributed is installed.

Every row's numbers are checked equal (bit for bit) to the in-process sweep
before the times are printed. ``python -m bench.sweep [--quick]``
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from bench._common import LoadMonitor, start_benchmark


def _timed(fn):
    with LoadMonitor() as mon:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    return out, dt, mon.other


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="16 x 16 x 2 grid, 2000 steps")
    from pysharp.sweeps._compute import grid_points, initial_points

    side, seeds, steps = (16, 2, 2000) if args.quick else (64, 4, 10_000)
    grid = dict(lr=np.geomspace(0.02, 2.0, side), wd=np.geomspace(1e-5, 1e-3, side),
                seeds=np.arange(seeds), init_norm=10.0)
    run = dict(steps=steps, record_every=100, sharpness_every=500)
    chunk = 2048
    spec = {"name": "bn_linear_regression"}
    n = side * side * seeds
    print(f"sweep: BN linear regression d40 n20, {side} x {side} lr x wd x {seeds} seeds = {n} "
          f"trajectories, {steps} steps, sharpness every 500, chunks of {chunk}; "
          f"{os.cpu_count()} cores")

    model = ps.BNLinearRegression.synthetic()
    axes = {"lr": grid["lr"], "wd": grid["wd"], "seed": grid["seeds"],
            "init_norm": np.array([10.0])}
    blocks = []
    for start in range(0, n, chunk):
        pts = grid_points(axes, start, min(start + chunk, n))
        blocks.append((start, initial_points(model, pts["seed"], pts["init_norm"]), pts))
    ps.run_gd_wd(model, blocks[0][1][:8], 0.1, 1e-4, 10)  # warm-up (first-call costs)
    ps.sweep(spec, lr=0.1, wd=1e-4, steps=10, progress=False)  # imports xarray once

    def raw():
        return [ps.run_gd_wd(model, W0, p["lr"], p["wd"], first_trajectory=s, **run)
                for s, W0, p in blocks]

    rows = []
    _, t_raw, load = _timed(raw)
    rows.append(("raw engine calls", t_raw, load))
    ref, t, load = _timed(lambda: ps.sweep(spec, **grid, **run, chunk_size=chunk, progress=False))
    rows.append(("sweep(), in-process", t, load))
    tmp = tempfile.mkdtemp()
    try:
        got, t, load = _timed(lambda: ps.sweep(spec, **grid, **run, chunk_size=chunk,
                                               store=os.path.join(tmp, "b.zarr"), progress=False))
        _check(ref, got, "store")
        rows.append(("sweep(), in-process + Zarr store", t, load))
    finally:
        shutil.rmtree(tmp)
    try:
        import distributed
    except ImportError:
        distributed = None
        print("  (distributed not installed: no LocalCluster row)")
    if distributed is not None:
        half = max(1, (os.cpu_count() or 2) // 2)
        os.environ["OMP_NUM_THREADS"] = str(half)  # read by the worker processes at start
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            ex = client.get_executor()
            ps.sweep(spec, lr=0.1, wd=1e-4, steps=10, executor=ex, progress=False)  # warm workers
            got, t, load = _timed(lambda: ps.sweep(spec, **grid, **run, chunk_size=chunk,
                                                   executor=ex, progress=False))
        _check(ref, got, "LocalCluster")
        rows.append((f"sweep(), 2-worker LocalCluster, {half} OMP thread(s) each", t, load))

    traj_steps = n * steps
    print(f"  {'':46s} {'wall s':>8s} {'traj-steps/s':>13s} {'vs raw':>8s}")
    for name, t, load in rows:
        flag = " !" if load is not None and load > 0.15 else ""
        print(f"  {name:46s} {t:8.3f} {traj_steps / t:13.3g} {t / t_raw:8.3f}{flag}")
    overhead = rows[1][1] / t_raw - 1
    print(f"  sweep() overhead over raw engine calls: {100 * overhead:+.1f}% (target < 5%)")
    print("  ('!' marks a row during which other processes used > 15% of the CPU; "
          "on the LocalCluster row those are its own workers)")
    return 0


def _check(ref, got, what: str) -> None:
    for name in ref.data_vars:
        if ref[name].values.tobytes() != got[name].values.tobytes():
            raise SystemExit(f"{what}: {name} differs from the in-process sweep")


if __name__ == "__main__":
    raise SystemExit(main())
