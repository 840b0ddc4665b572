"""Shared pieces of the experiments: the theory's initialisation, small maths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..sharpness import spherical_sharpness
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


def refined_entry(model, trajectory) -> int:
    """The EoS entry step to the resolution of the theta snapshots, not of the sharpness.

    The engine detects the entry at the first sharpness step where eff. LR x sharpness
    reaches 2 (1 - eos_tol); sharpness every few hundred steps costs Lanczos runs, theta
    snapshots are cheap. Between the previous sharpness step and the engine's entry the
    ratio rises (the effective LR grows, the sharpness at the minimum stays), so the first
    snapshot past the threshold is found by bisection, with the sharpness measured at
    about log2(snapshots in between) of them. Returns the engine's entry when it is -1 or
    no snapshot lies in between. A one-trajectory run whose theta snapshots are records
    (``theta_every`` a multiple of ``record_every``) is assumed.
    """
    entry = int(np.asarray(trajectory.eos_entry_step).reshape(-1)[0])
    if entry < 0 or trajectory.theta is None:
        return entry
    earlier = trajectory.sharpness_steps[trajectory.sharpness_steps < entry]
    start = int(earlier[-1]) if len(earlier) else -1
    th_steps = np.asarray(trajectory.theta_steps)
    steps = np.asarray(trajectory.steps)
    pick = np.flatnonzero((th_steps > start) & (th_steps <= entry))
    rec = np.minimum(np.searchsorted(steps, th_steps[pick]), len(steps) - 1)
    ok = steps[rec] == th_steps[pick]
    pick, rec = pick[ok], rec[ok]
    if not len(pick) or th_steps[pick[-1]] != entry:
        return entry
    theta = np.asarray(trajectory.theta).reshape(len(th_steps), -1)
    eff = np.asarray(trajectory.eff_lr).reshape(-1)
    threshold = 2 * (1 - trajectory.eos_tol)
    lo, hi = -1, len(pick) - 1  # below the threshold at lo (or before), past it at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        sharp = float(spherical_sharpness(model, theta[pick[mid]]).eigenvalues[0])
        if eff[rec[mid]] * sharp >= threshold:
            hi = mid
        else:
            lo = mid
    return int(th_steps[pick[hi]])


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


def footer(fig, text: str, shrunk: bool) -> None:
    """``text`` in a line under the panels of a constrained-layout figure: how the run
    departs from the paper's setting, in red when it does (``shrunk``)."""
    fig.get_layout_engine().set(rect=(0, 0.045, 1, 0.955))   # room for the line below
    fig.text(0.5, 0.004, text, ha="center", va="bottom", fontsize=8,
             color="C3" if shrunk else "k", wrap=True)


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
