"""Shared pieces of the experiments: the theory's initialisation, small maths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from . import plt


def theory_start(zeta: np.ndarray, sharpness: float, lr: float, wd: float, *,
                 margin: float = 0.98, perturbation: float = 1e-3, seed: int = 0) -> np.ndarray:
    """A GD+WD start near zeta on Gamma with effective LR margin * 2 / lambda_1(zeta).

    The direction is zeta plus a random tangent-to-sphere perturbation of size
    ``perturbation``; the norm sets eff_lr(0) = lr / ((1 - lr wd) ||w0||^2).
    """
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(zeta.shape)
    p -= (p @ zeta) * zeta
    w = zeta + perturbation * p / np.linalg.norm(p)
    eff = margin * 2.0 / sharpness
    norm2 = lr / ((1 - lr * wd) * eff)
    return w * np.sqrt(norm2) / np.linalg.norm(w)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of the last axis of a (..., D) against a vector b (D,)."""
    return (a @ b) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b))


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


# -- figures ---------------------------------------------------------------------------
def _fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}".replace(",", " ") if abs(value) >= 10_000 else str(int(value))
    return f"{float(value):g}"


def settings_line(settings: dict) -> str:
    """``settings`` as one line for a figure: ``model: BN...; lr 0.5; wd 0.0002; steps 100 000``."""
    return "; ".join(f"{key}: {value}" if isinstance(value, str) else f"{key} {_fmt(value)}"
                     for key, value in settings.items())


def subplots(nrows: int, ncols: int, figsize, **kwargs):
    """pyplot.subplots with constrained layout (no tight-layout warnings, room for suptitles)."""
    return plt().subplots(nrows, ncols, figsize=figsize, layout="constrained", **kwargs)


def save(fig, out, stem: str, title: str, settings: dict) -> str:
    """Title the figure with ``title`` and its settings, save ``out/stem.png``, close it.

    Returns the file name. ``stem`` is the experiment's name (or starts with it), so an
    experiment's JSON and figures share one stem.
    """
    width = max(40, int(fig.get_figwidth() * 13))
    fig.suptitle(title + "\n" + textwrap.fill(settings_line(settings), width), fontsize=10)
    name = f"{stem}.png"
    fig.savefig(Path(out) / name, dpi=110)
    plt().close(fig)
    return name


def log_ticks(ax, axis: str = "y") -> None:
    """Readable ticks on a log axis spanning a decade or two: 1, 2, 5 x 10^k, no minor labels.

    Matplotlib labels the minor ticks of a short log axis (2x10^-2, 3x10^-2, ...), which
    then overlap.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=30))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
