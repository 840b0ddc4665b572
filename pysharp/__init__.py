"""pysharp: fast kernels for sharpness, the Edge of Stability and normalization.

A compiled C++ core (pysharp._core) with a thin Python layer. See README.md.
"""

from ._backend import build_info
from ._dispatch import BackendUnavailable, backends
from . import stability, theory
from .dynamics import Trajectory, run_gd_wd, run_pgd, run_scalar_rmsprop
from .models import (BNLinearRegression, BNMatrixCompletion, LinearRegression, ScaleInvariantModel,
                     Toy3D, TwoLayerNet)
from .sgd import SGDResult, run_sgd
from .sharpness import EigenResult, lanczos, spherical_sharpness
from .spectra import (LossSlice, SpectralDensity, Spectrum, TraceEstimate, hessian_spectrum,
                      hessian_trace, loss_slice, spectral_density)
from .sweeps import open_sweep, sweep

__version__ = "0.1.0"

__all__ = ["BNLinearRegression", "BNMatrixCompletion", "ScaleInvariantModel", "Toy3D",
           "LinearRegression", "TwoLayerNet", "run_sgd", "SGDResult", "stability",
           "Trajectory", "run_gd_wd", "run_pgd", "run_scalar_rmsprop",
           "EigenResult", "spherical_sharpness", "lanczos", "theory", "sweep", "open_sweep",
           "build_info", "backends", "BackendUnavailable", "__version__"]
__all__ += ["hessian_spectrum", "hessian_trace", "spectral_density", "loss_slice", "Spectrum",
            "TraceEstimate", "SpectralDensity", "LossSlice"]
