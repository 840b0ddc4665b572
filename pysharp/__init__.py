"""pysharp: fast kernels for sharpness, the Edge of Stability and normalization.

A compiled C++ core (pysharp._core) with a thin Python layer. See README.md.
"""

from . import stability, theory
from ._backends import BackendUnavailable, backends
from ._engine.loader import build_info
from ._version import __version__
from .dynamics import QuasiRMSprop, Trajectory, run_gd_wd, run_pgd, run_scalar_rmsprop
from .models import (
    BNLinearRegression,
    BNMatrixCompletion,
    BNTwoLayerNet,
    LinearRegression,
    LoadedModel,
    ScaleInvariantModel,
    Toy3D,
    TwoLayerNet,
    from_jax,
    include_dir,
    load_model,
)
from .period_two import PeriodTwoDiagnostics, period_two_diagnostics
from .sgd import SGDResult, run_sgd
from .sharpness import EigenResult, lanczos, spherical_sharpness
from .spectra import (
    LossSlice,
    SpectralDensity,
    Spectrum,
    TraceEstimate,
    hessian_spectrum,
    hessian_trace,
    loss_slice,
    spectral_density,
)
from .sweeps import open_sweep, sweep

__all__ = ["BNLinearRegression", "BNMatrixCompletion", "BNTwoLayerNet", "ScaleInvariantModel",
           "Toy3D",
           "LinearRegression", "TwoLayerNet", "run_sgd", "SGDResult", "stability",
           "Trajectory", "run_gd_wd", "run_pgd", "run_scalar_rmsprop", "QuasiRMSprop",
           "EigenResult", "spherical_sharpness", "lanczos", "theory", "sweep", "open_sweep",
           "build_info", "backends", "BackendUnavailable", "__version__"]
__all__ += ["LoadedModel", "load_model", "include_dir"]
__all__ += ["from_jax"]
__all__ += ["hessian_spectrum", "hessian_trace", "spectral_density", "loss_slice", "Spectrum",
            "TraceEstimate", "SpectralDensity", "LossSlice"]
__all__ += ["period_two_diagnostics", "PeriodTwoDiagnostics"]
