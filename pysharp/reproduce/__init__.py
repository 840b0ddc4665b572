"""``pysharp reproduce NAME``: the theory's predictions as figures and numbers.

Each experiment is a module here with ``DESCRIPTION`` (one line) and
``run(out: pathlib.Path, quick: bool) -> dict``, which writes its PNG figures
into ``out`` and returns the measured numbers (saved as ``NAME.json``).
Defaults take a couple of minutes at most on 2 cores; ``quick`` takes seconds.
Modules load lazily, so matplotlib is only imported when a figure is drawn.
"""

from __future__ import annotations

import importlib
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
}


def names() -> list[str]:
    return sorted(REGISTRY)


def run(name: str, out, quick: bool = False) -> dict:
    """Run one experiment; write its figures and ``NAME.json`` into ``out``.

    Returns the summary dict (also holding ``seconds``, the wall time).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(names()) or 'none'}")
    plt()  # fail before any work when matplotlib is missing
    module = importlib.import_module(f"pysharp.reproduce.{REGISTRY[name]}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = module.run(out, quick)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["quick"] = quick
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def run_all(out, quick: bool = False) -> dict:
    """Run every experiment and write ``index.md`` linking figures and numbers."""
    out = Path(out)
    results = {name: run(name, out, quick) for name in names()}
    lines = ["# pysharp reproduce: all experiments", ""]
    for name, summary in results.items():
        module = importlib.import_module(f"pysharp.reproduce.{REGISTRY[name]}")
        lines += [f"## {name}", "", module.DESCRIPTION, ""]
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
