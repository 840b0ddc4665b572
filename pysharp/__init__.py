"""pysharp: fast kernels for sharpness, the Edge of Stability and normalization.

A compiled C++ core (pysharp._core) with a thin Python layer. See README.md.
"""

from ._backend import build_info
from .models import BNLinearRegression, BNMatrixCompletion, ScaleInvariantModel, Toy3D

__version__ = "0.1.0"

__all__ = ["BNLinearRegression", "BNMatrixCompletion", "ScaleInvariantModel", "Toy3D",
           "build_info", "__version__"]
