"""Parameter sweeps: a grid of GD+WD, projected GD, scalar RMSprop or SGD runs in chunked
engine calls, resumable on Zarr.

``pysharp.sweep(...)`` runs the grid and returns an xarray Dataset;
``pysharp.open_sweep(store)`` reads a finished store back; ``load_config``
reads the TOML files of ``pysharp sweep``. See ``_sweep.sweep`` for the
layout of results and ``_store`` for what makes a store safe to resume.
"""

from ..models._registry import REGISTRY as MODELS
from ._plot import plot
from ._store import StoreMismatch
from ._sweep import SweepDiskFull, SweepInterrupted, open_sweep, sweep

__all__ = ["sweep", "open_sweep", "StoreMismatch", "SweepInterrupted", "SweepDiskFull", "MODELS",
           "plot"]
