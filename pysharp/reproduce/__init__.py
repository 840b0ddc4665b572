"""``pysharp reproduce NAME``: the theory's predictions as figures and numbers.

Each experiment is a module here with ``DESCRIPTION`` (one line) and
``run(out: pathlib.Path, quick: bool) -> dict``, which writes its PNG figures
into ``out`` and returns the measured numbers (saved as ``NAME.json``).
Defaults take a couple of minutes at most on 2 cores; ``quick`` takes seconds.
Modules load lazily, so matplotlib is only imported when a figure is drawn. A module
needing optional packages names them in ``REQUIRES`` (import name -> pip name) and
the command installing them in ``INSTALL``; ``run_all`` skips it when one is missing. A
module reading a published dataset names it in ``DATASET`` (``_datasets.how_to_get``) and
takes ``run(out, quick, data=DIR, full=False)``: ``full`` is the paper's own size (a GPU's
work); ``run_all``, which has no data, skips it, saying what to download.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
from pathlib import Path

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
    """The packages experiment ``name`` needs and this environment lacks, as a sentence."""
    module = _module(name)
    lacking = [pip for mod, pip in getattr(module, "REQUIRES", {}).items()
               if importlib.util.find_spec(mod) is None]
    if not lacking:
        return None
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


def run(name: str, out, quick: bool = False, *, data=None, full: bool = False) -> dict:
    """Run one experiment; write its figures and ``NAME.json`` into ``out``.

    ``data`` (a folder of the dataset's files) and ``full`` (the paper's own size) are for
    the experiments on published data (``DATASET``). Returns the summary dict (also holding
    ``seconds``, the wall time).

    Raises
    ------
    ValueError
        ``name`` is not an experiment; ``data`` or ``full`` given to one that takes neither;
        the dataset's files are not in ``data`` (``_datasets.DataNotFound``, saying what to
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
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = module.run(out, quick, data=data, full=full) if on_data else module.run(out, quick)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["quick"] = quick
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def run_all(out, quick: bool = False) -> dict:
    """Run every experiment and write ``index.md`` linking figures and numbers.

    An experiment whose optional packages are missing (``missing(name)``) is skipped:
    ``index.md`` says so and what to install, and the result has no entry for it.
    """
    out = Path(out)
    skipped = {name: missing(name) for name in names()}
    results = {name: run(name, out, quick) for name in names() if not skipped[name]}
    lines = ["# pysharp reproduce: all experiments", ""]
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
