"""Figures of a sweep Dataset: a heatmap over two grid axes, or lines along one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from ._compute import ALL_GRID_DIMS

_REDUCERS = {"mean": np.nanmean, "median": np.nanmedian, "min": np.nanmin, "max": np.nanmax}
# Integer codes where -1 means "never": not a value to average.
_NEVER_IS_MINUS_ONE = ("eos_entry_step", "diverged_step")
# Heatmaps whose cells tell "never entered EoS" apart from "entered by the first sharpness
# record" (eos_entry_step: -1 and a step <= the first record after step 0; sharpness_drop is
# NaN in both cases).
_ENTRY_METRICS = ("eos_entry_step", "sharpness_drop")
# Centred colour scales: metric -> the value at the centre of a diverging colormap.
_CENTRED = {"rho_T2": 1.0}


def metric_values(ds, metric: str, keep: list[str], reduce: str = "mean",
                  sel: dict | None = None) -> tuple[np.ndarray, dict]:
    """``metric`` over the axes ``keep``, the other grid axes reduced (NaN-aware).

    ``sel`` picks single values of grid axes first (nearest value; see ``selected``).
    ``eos_entry_step`` and ``diverged_step`` of -1 ("never") become NaN, and
    booleans become fractions, so a mean over seeds means what it says.
    """
    if metric not in ds.data_vars:
        raise ValueError(f"unknown metric {metric!r}; the store has {sorted(ds.data_vars)}")
    if reduce not in _REDUCERS:
        raise ValueError(f"reduce must be one of {sorted(_REDUCERS)}, got {reduce!r}")
    da = _select(ds[metric], sel)
    for dim in keep:
        if dim not in da.dims:
            raise ValueError(f"{metric} has no axis {dim!r}; its axes are {list(da.dims)}")
    values = da.values.astype(np.float64)
    if metric in _NEVER_IS_MINUS_ONE:
        values[values < 0] = np.nan
    return _reduce(values, da.dims, keep, reduce), {d: ds[d].values for d in keep}


def _select(da, sel: dict | None):
    for dim, value in (sel or {}).items():
        if dim not in ALL_GRID_DIMS or dim not in da.dims:
            grid_axes = [d for d in da.dims if d in ALL_GRID_DIMS]
            raise ValueError(f"can only select grid axes {grid_axes}, got {dim!r}")
        da = da.sel({dim: value}, method="nearest")
    return da


def _reduce(values: np.ndarray, dims, keep: list[str], reduce: str) -> np.ndarray:
    other = tuple(i for i, d in enumerate(dims) if d not in keep)
    if other:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells stay NaN
            values = _REDUCERS[reduce](values, axis=other)
    kept = [d for d in dims if d in keep]
    if kept != list(keep):
        values = values.T
    return values


def selected(ds, sel: dict | None) -> dict:
    """grid axis -> (requested value, the grid value ``sel`` actually uses: the nearest)."""
    out = {}
    for dim, value in (sel or {}).items():
        if dim in ds.coords:
            grid = np.asarray(ds[dim].values)
            out[dim] = (value, grid[int(np.argmin(np.abs(grid - float(value))))])
    return out


def _num(v) -> str:
    """A grid value as a reader expects it: 0.5, 9.64e-05, 1e-04 -> 1e-4."""
    v = float(v)
    text = f"{v:.3g}"
    if v and abs(v) < 1e-3 and "e" not in text:
        text = f"{v:.2e}"
    if "e" in text:
        mantissa, exp = text.split("e")
        mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
        text = f"{mantissa}e{int(exp)}"
    return text


def selection_text(ds, sel: dict | None) -> str:
    """``wd = 9.64e-5 (nearest to 1e-4)``: the grid values a selection uses."""
    parts = []
    for dim, (asked, used) in selected(ds, sel).items():
        note = "" if np.isclose(float(asked), float(used), rtol=1e-9, atol=0) else \
            f" (nearest to {_num(asked)})"
        parts.append(f"{dim} = {_num(used)}{note}")
    return ", ".join(parts)


def _log_spaced(v: np.ndarray) -> bool:
    """Show this axis on a log scale: positive values spanning a decade or more."""
    v = np.asarray(v, dtype=float)
    return v.size > 1 and bool(np.all(v > 0)) and v.max() / v.min() >= 10


def _log_axis(name: str, v: np.ndarray) -> bool:
    """Log scale for log-spaced axes, and for batch sizes (1, 2, 4, 8 reads on a log axis)."""
    v = np.asarray(v, dtype=float)
    return _log_spaced(v) or (name == "batch" and v.size > 1 and bool(np.all(v > 0)))


def _is_loss(metric: str) -> bool:
    return "loss" in metric


def _colour_scale(metric: str, values: np.ndarray):
    """(cmap, norm) of a heatmap: centred for rho_T2, log for losses spanning a decade."""
    from matplotlib.colors import LogNorm, Normalize, TwoSlopeNorm

    finite = values[np.isfinite(values)]
    if metric in _CENTRED:
        c = _CENTRED[metric]
        lo = min(finite.min(), c) if finite.size else c
        hi = max(finite.max(), c) if finite.size else c
        span = max(hi - lo, 1e-12 * max(abs(c), 1.0))
        return "RdBu_r", TwoSlopeNorm(vcenter=c, vmin=min(lo, c - 1e-3 * span),
                                      vmax=max(hi, c + 1e-3 * span))
    if _is_loss(metric) and finite.size and finite.min() > 0 and finite.max() / finite.min() > 10:
        return "viridis", LogNorm(finite.min(), finite.max())
    return "viridis", Normalize()


def _entry_cells(ds, x: str, y: str, sel: dict | None):
    """(never, early, first record): cells where no run entered EoS, and cells where every
    run that entered did so by the first sharpness record after step 0 (the entry step is
    then only known to lie in [0, first record], and the sharpness drop is undefined)."""
    da = _select(ds["eos_entry_step"], sel)
    v = da.values
    steps = ds["sharpness_step"].values if "sharpness_step" in ds.coords else np.array([])
    first = int(steps[1]) if len(steps) > 1 else 0
    never = _reduce((v < 0).astype(float), da.dims, [x, y], "mean")
    early = _reduce(((v >= 0) & (v <= first)).astype(float), da.dims, [x, y], "mean")
    return never >= 1, (early > 0) & (early + never >= 1 - 1e-12), first


def _shade_cells(ax, ex, ey, mask, hatch: str) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    cells = [Rectangle((ex[i], ey[j]), ex[i + 1] - ex[i], ey[j + 1] - ey[j])
             for i, j in zip(*np.nonzero(mask))]
    if cells:
        ax.add_collection(PatchCollection(cells, facecolor="none", edgecolor="0.55",
                                          hatch=hatch, lw=0))


def draw(ax, ds, *, x: str, metric: str, y: str | None = None, hue: str | None = None,
         reduce: str = "mean", sel: dict | None = None) -> None:
    """Draw the heatmap (with ``y``) or the lines (along ``x``) of ``metric`` on ``ax``."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    label = f"{metric} ({reduce} over other axes)" if len(ds[metric].dims) > 2 else metric
    if y is not None:
        values, coords = metric_values(ds, metric, [x, y], reduce, sel)
        xs, ys = coords[x], coords[y]
        cmap, norm = _colour_scale(metric, values)
        ex, ey = _edges(xs, _log_axis(x, xs)), _edges(ys, _log_axis(y, ys))
        mesh = ax.pcolormesh(ex, ey, np.ma.masked_invalid(values.T),
                             shading="flat", cmap=cmap, norm=norm)
        cbar = ax.figure.colorbar(mesh, ax=ax, label=label)
        if metric in _CENTRED:
            cbar.ax.axhline(_CENTRED[metric], color="k", lw=1)
        ax.set(xlabel=x, ylabel=y)
        for name, v, axis, setter in ((x, xs, ax.xaxis, ax.set_xscale),
                                      (y, ys, ax.yaxis, ax.set_yscale)):
            if _log_axis(name, v):
                setter("log")
                axis.set_minor_formatter(NullFormatter())
                if name == "batch":
                    (ax.set_xticks if axis is ax.xaxis else ax.set_yticks)(
                        v, [_num(b) for b in v])
        handles = []
        if np.isnan(values).any():
            ax.set_facecolor("0.85")
            handles.append(Patch(facecolor="0.85", edgecolor="0.5",
                                 label="grey: never entered EoS / undefined"
                                 if metric in _ENTRY_METRICS else "grey: undefined (NaN)"))
        if metric in _ENTRY_METRICS and "eos_entry_step" in ds.data_vars:
            _, early, first = _entry_cells(ds, x, y, sel)
            if early.any():
                _shade_cells(ax, ex, ey, early, "////")
                handles.append(Patch(facecolor="none", edgecolor="0.55", hatch="////",
                                     label=f"entered by the first sharpness record "
                                           f"(step {first})"))
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper center", ncol=len(handles),
                      bbox_to_anchor=(0.5, -0.13), frameon=False)
    else:
        values, coords = metric_values(ds, metric, [x] + ([hue] if hue else []), reduce, sel)
        xs = coords[x]
        if hue:
            hv = np.asarray(coords[hue])
            if np.issubdtype(hv.dtype, np.number):
                from matplotlib import colormaps

                positive = hv.size > 1 and bool(np.all(hv > 0))
                norm = LogNorm(hv.min(), hv.max()) if positive and hv.max() / hv.min() > 10 \
                    else Normalize(hv.min(), hv.max() if hv.max() > hv.min() else hv.min() + 1)
                cmap = colormaps["viridis"]
                for j, h in enumerate(hv):
                    ax.plot(xs, values[:, j], "-", lw=0.9, color=cmap(norm(h)))
                ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=hue)
            else:
                for j, h in enumerate(hv):
                    ax.plot(xs, values[:, j], ".-", label=f"{hue} = {h}")
                ax.legend(fontsize=7)
        else:
            ax.plot(xs, values, ".-")
        ax.set(xlabel=x, ylabel=label)
        if _log_axis(x, xs):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        finite = values[np.isfinite(values)]
        if _is_loss(metric) and finite.size and finite.min() > 0 and \
                finite.max() / finite.min() > 10:
            ax.set_yscale("log")
    at = selection_text(ds, sel)
    ax.set_title(metric + (f" at {at}" if at else ""), fontsize=10)


def model_title(model: dict) -> str:
    """A sweep's model in a few words: its name and parameters, or for a model instance its
    data by shape (``X 24x8``) and numbers, never the hashes and module names that pin
    it (the store keeps those); a header's struct and file, a ``from_jax`` model's loss."""
    model = dict(model)
    name = model.pop("name", "model")
    data = model.get("data")
    if not isinstance(data, dict):  # a spec: a registered name and its factory's parameters
        params = ", ".join(f"{k}={v}" for k, v in model.items() if k != "X")
        return f"{name}({params})" if params else str(name)
    if "model_name" not in data:  # a built-in model instance: its data
        return f"{name}({_data_text(data)})"
    struct, header = str(data["model_name"]), Path(str(data.get("header", "")))
    if header.parent.name == "jax" and struct.startswith("Jax_"):  # from_jax: its own names
        return f"{struct[len('Jax_'):]} (from_jax)"  # are the loss's, not the fields'
    return f"{struct} ({header.name}: {_data_text(data.get('fields') or {})})"


def _data_text(data: dict) -> str:
    parts = []
    for key, value in data.items():
        if isinstance(value, dict) and "shape" in value:  # an array, by its hash and shape
            parts.append(f"{key} {'x'.join(str(n) for n in value['shape']) or 'scalar'}")
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            parts.append(f"{key}={_num(value) if isinstance(value, float) else value}")
    return ", ".join(parts)


def settings_text(ds) -> str:
    """The sweep's model, method and run settings, for a figure's title."""
    try:
        ident = json.loads(ds.attrs["pysharp_sweep"])
    except (KeyError, TypeError, ValueError):
        return ""
    model_text = model_title(ident.get("model") or {})
    grid = ", ".join(f"{d} x{len(v)}" if len(v) > 1 else f"{d} {_num(v[0])}"
                     for d, v in (ident.get("grid") or {}).items()
                     if isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v))
    run = ident.get("settings") or {}
    run_text = ", ".join(f"{k} {run[k]}" for k in ("steps", "record_every", "sharpness_every")
                         if k in run)
    return f"{model_text}, {ident.get('method', 'gd_wd')}; grid: {grid}; {run_text}"


def plot(ds, *, x: str, metric: str | list[str], y: str | None = None, hue: str | None = None,
         reduce: str = "mean", sel: dict | None = None, out: str | Path | None = None):
    """Heatmap of ``metric`` over (x, y), or lines along x (coloured by ``hue``).

    A list of metrics gives one panel each. A numeric ``hue`` is a colour bar (log-scaled
    when its values are positive and span more than a decade). ``sel`` picks the nearest
    grid value; the panel's title names the value used. Returns the matplotlib Figure;
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
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.9 * rows), squeeze=False,
                             layout="constrained")
    for ax, m in zip(axes.flat, metrics):
        draw(ax, ds, x=x, metric=m, y=y, hue=hue, reduce=reduce, sel=sel)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    settings = settings_text(ds)
    if settings:
        import textwrap

        fig.suptitle(textwrap.fill(settings, int(fig.get_figwidth() * 13)), fontsize=9)
    if out is not None:
        fig.savefig(out, dpi=110)
        plt.close(fig)
    return fig


def _edges(v: np.ndarray, log: bool | None = None) -> np.ndarray:
    """Cell edges around centres ``v`` (geometric midpoints on a log axis)."""
    v = np.asarray(v, dtype=float)
    if v.size == 1:
        return np.array([v[0] * 0.9, v[0] * 1.1]) if v[0] else np.array([-0.5, 0.5])
    log = _log_spaced(v) if log is None else log
    t = np.log(v) if log else v
    mid = (t[1:] + t[:-1]) / 2
    e = np.concatenate([[t[0] - (mid[0] - t[0])], mid, [t[-1] + (t[-1] - mid[-1])]])
    return np.exp(e) if log else e
