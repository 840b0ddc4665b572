"""``pysharp reproduce NAME``: the theory's predictions as figures and numbers.

Each experiment is a module here with ``DESCRIPTION`` (one line) and
``run(out: pathlib.Path, quick: bool) -> dict``, which writes its PNG figures
into ``out`` and returns the measured numbers (saved as ``NAME.json``).
Defaults take a couple of minutes at most on 2 cores; ``quick`` takes seconds.
Modules load lazily, so matplotlib is only imported when a figure is drawn. A module
needing optional packages names them in ``REQUIRES`` (import name -> pip name) and
the command installing them in ``INSTALL``; ``run_all`` skips it when one is missing (and
when its ``lacking()``, if it has one, names anything else it needs and lacks). A
module reading a published dataset names it in ``DATASET`` (``_datasets.how_to_get``) and
takes ``run(out, quick, data=DIR, full=False)``: ``full`` is the paper's own size (a GPU's
work); ``run_all``, which has no data, skips it, saying what to download. A module with
choices of its own (``cifar-sharpness``'s network) names them in ``OPTIONS`` (option ->
its choices, the default first); :func:`run` passes them through as keywords.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import time
from pathlib import Path

from .._engine.loader import build_info

#: experiment name -> module under pysharp.reproduce
REGISTRY: dict[str, str] = {
    "toy3d": "toy3d",
    "bn-linreg-periodic": "bn_linreg_periodic",
    "bn-linreg-minnorm": "bn_linreg_minnorm",
    "matrix-completion": "matrix_completion",
    "tracking": "tracking",
    "ablation": "ablation",
    "sgd-stability": "sgd_stability",
    "central-flow": "central_flow",
    "spectra": "spectra",
    "period-two": "period_two",
    "digits": "digits",
    "cifar-sharpness": "cifar_sharpness",
    "fashion-stability": "fashion_stability",
}


def names() -> list[str]:
    return sorted(REGISTRY)


def _module(name: str):
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(names()) or 'none'}")
    return importlib.import_module(f"pysharp.reproduce.{REGISTRY[name]}")


def _lacking(name: str) -> str | None:
    """The packages experiment ``name`` needs and this environment lacks, as a sentence; or
    what else it lacks, from the module's own ``lacking()`` (a C++ compiler, for toy3d)."""
    module = _module(name)
    lacking = [pip for mod, pip in getattr(module, "REQUIRES", {}).items()
               if importlib.util.find_spec(mod) is None]
    if not lacking:
        other = module.lacking() if hasattr(module, "lacking") else None
        return None if other is None else f"`pysharp reproduce {name}` needs {other}"
    return f"`pysharp reproduce {name}` needs {' and '.join(lacking)}: {module.INSTALL}"


def missing(name: str, data=None) -> str | None:
    """What experiment ``name`` needs and this environment lacks, as a sentence; None if nothing.

    An experiment on a published dataset (``DATASET``) lacks its files when ``data`` is None.

    Raises
    ------
    ValueError
        ``name`` is not an experiment.
    """
    lacking = _lacking(name)
    dataset = getattr(_module(name), "DATASET", None)
    if lacking is None and dataset is not None and data is None:
        from ._datasets import how_to_get  # lazy: only experiments on published data need it

        return f"`pysharp reproduce {name}` needs --data DIR. {how_to_get(dataset)}"
    return lacking


def run(name: str, out, quick: bool = False, *, data=None, full: bool = False,
        options: dict[str, str] | None = None) -> dict:
    """Run one experiment; write its figures and ``NAME.json`` into ``out``.

    ``data`` (a folder of the dataset's files) and ``full`` (the paper's own size) are for
    the experiments on published data (``DATASET``). ``options`` are the experiment's own
    choices, those its module's ``OPTIONS`` names (``{"net": "resnet20"}`` for
    ``cifar-sharpness``; the command line's ``--net``). Returns the summary dict (also
    holding ``seconds``, the wall time).

    Raises
    ------
    ValueError
        ``name`` is not an experiment; ``data`` or ``full`` given to one that takes neither;
        an option the experiment does not take, or a value not among its choices; the
        dataset's files are not in ``data`` (``_datasets.DataNotFound``, saying what to
        download).
    ImportError
        matplotlib, or a package the experiment needs (``missing(name)``), is not installed.
    """
    module = _module(name)
    plt()  # fail before any work when matplotlib is missing
    lacking = _lacking(name)
    if lacking:
        raise ImportError(lacking)
    on_data = getattr(module, "DATASET", None) is not None
    if not on_data and (data is not None or full):
        raise ValueError(f"`pysharp reproduce {name}` takes neither --data nor --full")
    options = dict(options or {})
    choices = getattr(module, "OPTIONS", {})
    for option, value in options.items():
        if option not in choices:
            raise ValueError(f"`pysharp reproduce {name}` takes no --{option}")
        if value not in choices[option]:
            raise ValueError(f"--{option} of `pysharp reproduce {name}` must be one of "
                             f"{', '.join(choices[option])}, got {value!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = (module.run(out, quick, data=data, full=full, **options) if on_data
               else module.run(out, quick, **options))
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["quick"] = quick
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def run_all(out, quick: bool = False, workers: int = 1) -> dict:
    """Run every experiment and write ``index.md`` linking figures and numbers.

    An experiment whose optional packages are missing (``missing(name)``) is skipped:
    ``index.md`` says so and what to install, and the result has no entry for it. The total
    wall time, each experiment's, the threads and the machine's load go to ``all.json``
    (:func:`timing`) and to the top of ``index.md``.

    ``workers`` > 1 runs the experiments in that many processes at once (spawned, one core
    thread each unless ``OMP_NUM_THREADS`` says otherwise), the longest of an earlier
    ``all.json`` in ``out`` first. Most experiments are a Python loop around small core calls,
    so on 2 cores two at a time take about half the wall time of one at a time; the numbers
    are the same (the core's bits do not depend on its threads). Figures are then drawn in
    the workers, out of sight of anything patched in this process (``workers=1`` for that).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = _load_average()
    t0 = time.perf_counter()
    skipped = {name: missing(name) for name in names()}
    todo = [name for name in names() if not skipped[name]]
    workers = max(1, min(int(workers), len(todo)))
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        earlier = _earlier_seconds(out)
        order = sorted(todo, key=lambda name: -earlier.get(name, 0.0))
        # spawn, not fork: a forked child inherits a parent's OpenMP runtime mid-state
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {name: pool.submit(run, name, out, quick) for name in order}
            results = {name: futures[name].result() for name in todo}
    else:
        results = {name: run(name, out, quick) for name in todo}
    total = timing_record(time.perf_counter() - t0, results, quick, load_start, workers)
    (out / "all.json").write_text(json.dumps(total, indent=2))
    lines = ["# pysharp reproduce: all experiments", "", timing_line(total), ""]
    for name in names():
        lines += [f"## {name}", "", _module(name).DESCRIPTION, ""]
        if skipped[name]:
            lines += [f"Skipped: {skipped[name]}.", ""]
            continue
        summary = results[name]
        for fig in summary.get("figures", []):
            lines.append(f"![{name}]({fig})")
        lines += ["", "| quantity | value |", "| --- | --- |"]
        for key, value in summary.items():
            if key != "figures" and not isinstance(value, (list, dict)):
                lines.append(f"| {key} | {value} |")
        lines.append("")
    (out / "index.md").write_text("\n".join(lines))
    return results


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):   # not on every platform
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _earlier_seconds(out: Path) -> dict[str, float]:
    try:
        return dict(timing(out)["experiments"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def timing_record(seconds: float, results: dict, quick: bool, load_start,
                  workers: int = 1) -> dict:
    """What ``all.json`` holds: the total wall time of ``run_all`` (s), each experiment's,
    the worker processes and the core's threads in each (``OMP_NUM_THREADS``, else one in a
    worker and the core's default alone), the CPU and the load average (1, 5, 15 min) at the
    start and the end (None where the platform has none)."""
    threads = int(build_info().get("max_threads", 1))
    if workers > 1:
        threads = int(os.environ.get("OMP_NUM_THREADS", "1").split(",")[0])
    return {"seconds": round(seconds, 1), "quick": quick,
            "experiments": {name: s["seconds"] for name, s in results.items()},
            "workers": workers, "threads": threads,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
            "load_average_start": load_start, "load_average_end": _load_average()}


def timing_line(record: dict) -> str:
    """``record`` (:func:`timing_record`) as one sentence for ``index.md`` and the command."""
    load = record["load_average_start"], record["load_average_end"]
    load_text = ("" if None in load else
                 f", load average {load[0][0]:g} at the start and {load[1][0]:g} at the end")
    n = len(record["experiments"])
    workers, threads = record.get("workers", 1), record["threads"]
    runs = (f"{workers} worker processes of {threads} thread{'s' * (threads != 1)}"
            if workers > 1 else f"{threads} thread{'s' * (threads != 1)}")
    return (f"Total wall time: {record['seconds']:.1f} s for {n} experiment{'s' * (n != 1)}"
            f"{' (--quick)' if record['quick'] else ''} on {record['cpu']} "
            f"({record['cpu_count']} CPUs, {runs}{load_text}).")


def timing(out) -> dict:
    """The timing record ``run_all`` wrote to ``out/all.json``."""
    return json.loads((Path(out) / "all.json").read_text())


def plt():
    """matplotlib.pyplot on the Agg backend, or a clear ImportError."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("pysharp reproduce draws figures with matplotlib: "
                          "pip install 'pysharp[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
