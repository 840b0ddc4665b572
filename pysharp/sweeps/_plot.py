"""Figures of a sweep Dataset: a heatmap over two grid axes, or lines along one."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ._compute import ALL_GRID_DIMS

_REDUCERS = {"mean": np.nanmean, "median": np.nanmedian, "min": np.nanmin, "max": np.nanmax}
# Integer codes where -1 means "never": not a value to average.
_NEVER_IS_MINUS_ONE = ("eos_entry_step", "diverged_step")


def metric_values(ds, metric: str, keep: list[str], reduce: str = "mean",
                  sel: dict | None = None) -> tuple[np.ndarray, dict]:
    """``metric`` over the axes ``keep``, the other grid axes reduced (NaN-aware).

    ``sel`` picks single values of grid axes first (nearest value).
    ``eos_entry_step`` and ``diverged_step`` of -1 ("never") become NaN, and
    booleans become fractions, so a mean over seeds means what it says.
    """
    if metric not in ds.data_vars:
        raise ValueError(f"unknown metric {metric!r}; the store has {sorted(ds.data_vars)}")
    if reduce not in _REDUCERS:
        raise ValueError(f"reduce must be one of {sorted(_REDUCERS)}, got {reduce!r}")
    da = ds[metric]
    for dim, value in (sel or {}).items():
        if dim not in ALL_GRID_DIMS or dim not in da.dims:
            grid_axes = [d for d in da.dims if d in ALL_GRID_DIMS]
            raise ValueError(f"can only select grid axes {grid_axes}, got {dim!r}")
        da = da.sel({dim: value}, method="nearest")
    for dim in keep:
        if dim not in da.dims:
            raise ValueError(f"{metric} has no axis {dim!r}; its axes are {list(da.dims)}")
    values = da.values.astype(np.float64)
    if metric in _NEVER_IS_MINUS_ONE:
        values[values < 0] = np.nan
    other = tuple(i for i, d in enumerate(da.dims) if d not in keep)
    if other:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells stay NaN
            values = _REDUCERS[reduce](values, axis=other)
    kept = [d for d in da.dims if d in keep]
    if kept != list(keep):
        values = values.T
    return values, {d: ds[d].values for d in keep}


def _log_spaced(v: np.ndarray) -> bool:
    """Show this axis on a log scale: positive values spanning a decade or more."""
    v = np.asarray(v, dtype=float)
    return v.size > 1 and bool(np.all(v > 0)) and v.max() / v.min() >= 10


def draw(ax, ds, *, x: str, metric: str, y: str | None = None, hue: str | None = None,
         reduce: str = "mean", sel: dict | None = None) -> None:
    """Draw the heatmap (with ``y``) or the lines (along ``x``) of ``metric`` on ``ax``."""
    from matplotlib.ticker import NullFormatter

    label = f"{metric} ({reduce} over other axes)" if len(ds[metric].dims) > 2 else metric
    if y is not None:
        values, coords = metric_values(ds, metric, [x, y], reduce, sel)
        xs, ys = coords[x], coords[y]
        mesh = ax.pcolormesh(_edges(xs), _edges(ys), np.ma.masked_invalid(values.T),
                             shading="flat", cmap="viridis")
        ax.figure.colorbar(mesh, ax=ax, label=label)
        ax.set(xlabel=x, ylabel=y)
        if _log_spaced(xs):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        if _log_spaced(ys):
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
        if np.isnan(values).any():
            ax.set_facecolor("0.85")
            ax.text(0.01, 0.01, "grey: never / undefined", transform=ax.transAxes, fontsize=7)
    else:
        values, coords = metric_values(ds, metric, [x] + ([hue] if hue else []), reduce, sel)
        xs = coords[x]
        if hue:
            for j, h in enumerate(coords[hue]):
                ax.plot(xs, values[:, j], ".-", label=f"{hue} = {h:.3g}")
            ax.legend(fontsize=7)
        else:
            ax.plot(xs, values, ".-")
        ax.set(xlabel=x, ylabel=label)
        if _log_spaced(xs):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
    at = ", ".join(f"{k}={v}" for k, v in (sel or {}).items())
    ax.set_title(metric + (f" at {at}" if at else ""), fontsize=10)


def plot(ds, *, x: str, metric: str | list[str], y: str | None = None, hue: str | None = None,
         reduce: str = "mean", sel: dict | None = None, out: str | Path | None = None):
    """Heatmap of ``metric`` over (x, y), or lines along x (one per ``hue`` value).

    A list of metrics gives one panel each. Returns the matplotlib Figure;
    with ``out`` it is saved there (format by suffix) and closed.
    """
    import matplotlib
    if out is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [metric] if isinstance(metric, str) else list(metric)
    for m in metrics:  # every name is checked before anything is drawn
        metric_values(ds, m, [x] + ([y] if y else []) + ([hue] if hue else []), reduce, sel)
    cols = min(len(metrics), 2)
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.6 * rows), squeeze=False)
    for ax, m in zip(axes.flat, metrics):
        draw(ax, ds, x=x, metric=m, y=y, hue=hue, reduce=reduce, sel=sel)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    fig.tight_layout()
    if out is not None:
        fig.savefig(out, dpi=110)
        plt.close(fig)
    return fig


def _edges(v: np.ndarray) -> np.ndarray:
    """Cell edges around centres ``v`` (geometric midpoints for log-spaced axes)."""
    v = np.asarray(v, dtype=float)
    if v.size == 1:
        return np.array([v[0] * 0.9, v[0] * 1.1]) if v[0] else np.array([-0.5, 0.5])
    t = np.log(v) if _log_spaced(v) else v
    mid = (t[1:] + t[:-1]) / 2
    e = np.concatenate([[t[0] - (mid[0] - t[0])], mid, [t[-1] + (t[-1] - mid[-1])]])
    return np.exp(e) if _log_spaced(v) else e
