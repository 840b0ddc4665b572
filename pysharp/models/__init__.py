"""The scale-invariant models: BN linear regression, BN matrix completion, a BN two-layer
network and a 3-D toy.

Each exposes batched, exact ``loss``, ``grad``, ``loss_and_grad``, ``hvp``,
``third`` (D^3L[v, v]) and ``hessian`` kernels from the compiled core.
"""

from ._base import ScaleInvariantModel
from ._bn_linear_regression import BNLinearRegression
from ._bn_matrix_completion import BNMatrixCompletion
from ._bn_two_layer_net import BNTwoLayerNet
from ._check import CheckReport, check
from ._compiler import ModelCompileError, include_dir
from ._from_jax import JaxModel, UnsupportedPrimitive, from_jax_file
from ._loaded import LoadedModel, LoadedSquareLossModel, load_model, load_model_files
from ._registry import REGISTRY, ModelEntry, Summary, entry_of, register
from ._square_loss import LinearRegression, SquareLossModel, TwoLayerNet  # SGD stability
from ._toy3d import Toy3D
from ._xla import XlaModel, from_jax  # any JAX network, run by XLA (compile=True: traced C++)
from ._xla_square_loss import XlaSquareLossModel, square_loss_from_jax  # SGD, in XLA

__all__ = ["ScaleInvariantModel", "BNLinearRegression", "BNMatrixCompletion", "BNTwoLayerNet",
           "Toy3D"]
__all__ += ["SquareLossModel", "LinearRegression", "TwoLayerNet"]
__all__ += ["LoadedModel", "LoadedSquareLossModel", "load_model", "load_model_files",
            "ModelCompileError", "include_dir"]
__all__ += ["REGISTRY", "ModelEntry", "Summary", "entry_of", "register"]
__all__ += ["check", "CheckReport"]
__all__ += ["from_jax", "from_jax_file", "JaxModel", "XlaModel", "UnsupportedPrimitive"]
__all__ += ["square_loss_from_jax", "XlaSquareLossModel"]
