"""
pysharp compiled core: batched model kernels (see pysharp.models).
"""

# Generated from the built module by pybind11-stubgen, then `ruff format`: do not edit.
# Regenerate after changing the bindings: python tools/stubs.py (--check in CI).

from __future__ import annotations

import collections.abc
import typing

import numpy
import numpy.typing

__all__: list[str] = [
    "BNLinearRegression_f32",
    "BNLinearRegression_f64",
    "BNMatrixCompletion_f32",
    "BNMatrixCompletion_f64",
    "BNTwoLayerNet_f32",
    "BNTwoLayerNet_f64",
    "BUILTIN_MODELS",
    "LANCZOS_MAX_ITER",
    "LOADED_ABI_SIZES_f32",
    "LOADED_ABI_SIZES_f64",
    "LOADED_ABI_VERSION",
    "LinearRegression_f32",
    "LinearRegression_f64",
    "LoadedCore_f32",
    "LoadedCore_f64",
    "LoadedLibrary_f32",
    "LoadedLibrary_f64",
    "METHODS",
    "RECORDS",
    "SAFE_NORM2",
    "Toy3D_f32",
    "Toy3D_f64",
    "TwoLayerNet_f32",
    "TwoLayerNet_f64",
    "bn_linreg_batch_loss_grad",
    "bn_linreg_jacobians",
    "bn_linreg_sgd",
    "build_info",
    "lanczos_callable",
    "linear_sgd",
    "max_threads",
    "set_num_threads",
    "sgd_batches",
    "slq",
]

class BNLinearRegression_f64:
    def __init__(
        self,
        Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        scale: typing.SupportsFloat | typing.SupportsIndex,
        sigma: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        ut: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        uperp2: typing.SupportsFloat | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class BNMatrixCompletion_f64:
    def __init__(
        self,
        rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        scale: typing.SupportsFloat | typing.SupportsIndex,
        m1: typing.SupportsInt | typing.SupportsIndex,
        m2: typing.SupportsInt | typing.SupportsIndex,
        rank: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def test_loss(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        values: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        value_mean: typing.SupportsFloat | typing.SupportsIndex,
        value_std: typing.SupportsFloat | typing.SupportsIndex,
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class BNTwoLayerNet_f64:
    def __init__(
        self,
        Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        width: typing.SupportsInt | typing.SupportsIndex,
        activation: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class Toy3D_f64:
    def __init__(self, c: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class BNLinearRegression_f32:
    def __init__(
        self,
        Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        u: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        scale: typing.SupportsFloat | typing.SupportsIndex,
        sigma: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        ut: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        uperp2: typing.SupportsFloat | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class BNMatrixCompletion_f32:
    def __init__(
        self,
        rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        u: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        scale: typing.SupportsFloat | typing.SupportsIndex,
        m1: typing.SupportsInt | typing.SupportsIndex,
        m2: typing.SupportsInt | typing.SupportsIndex,
        rank: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def test_loss(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        values: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        value_mean: typing.SupportsFloat | typing.SupportsIndex,
        value_std: typing.SupportsFloat | typing.SupportsIndex,
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class BNTwoLayerNet_f32:
    def __init__(
        self,
        Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        width: typing.SupportsInt | typing.SupportsIndex,
        activation: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class Toy3D_f32:
    def __init__(self, c: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class LinearRegression_f64:
    def __init__(
        self,
        X: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        bias: bool,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class TwoLayerNet_f64:
    def __init__(
        self,
        X: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        width: typing.SupportsInt | typing.SupportsIndex,
        activation: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class LinearRegression_f32:
    def __init__(
        self,
        X: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        bias: bool,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class TwoLayerNet_f32:
    def __init__(
        self,
        X: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        y: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        width: typing.SupportsInt | typing.SupportsIndex,
        activation: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

class LoadedCore_f64:
    """
    A run-time compiled model's struct, filled from its fields
    """
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.float64],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    ) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def group_bounds(self) -> typing.Any: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """
    @property
    def n_groups(self) -> int: ...

class LoadedLibrary_f64:
    """
    The table of a run-time compiled model (loaded_abi.hpp)
    """
    def Model(self, data: dict) -> LoadedCore_f64:
        """
        The model's struct bound to `data` {field: value}
        """
    def __init__(self, address: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        From the address pysharp_loaded_table() returned
        """
    @property
    def DTYPE(self) -> str: ...
    @property
    def FIELDS(self) -> list: ...
    @property
    def KIND(self) -> str: ...
    @property
    def MODEL_NAME(self) -> str: ...

class LoadedCore_f32:
    """
    A run-time compiled model's struct, filled from its fields
    """
    def hessian(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D) -> (H (B, D, D), ok (B,))
        """
    def hvp(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (H v (B, D), ok (B,))
        """
    def jacobians(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
    ]:
        """
        (P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))
        """
    def lanczos(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        options: dict,
        start: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None,
        streams: typing.Annotated[numpy.typing.ArrayLike, numpy.uint64] | None = None,
        counter: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.int32],
        numpy.typing.NDArray[numpy.uint8],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, streams[b] (default b), counter), as the engine keys a trajectory's at a step
        """
    def loss_grad(
        self, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
    ) -> tuple[
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.float32],
        numpy.typing.NDArray[numpy.uint8],
    ]:
        """
        (B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)
        """
    def plan(
        self,
        B: typing.SupportsInt | typing.SupportsIndex,
        config: dict | None = None,
        lanczos: dict | None = None,
    ) -> dict:
        """
        What a run of B trajectories allocates, for an engine that launches this core's kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one trajectory's state), jets (one derivative evaluation's, per order + 1); with an EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, result_names (the keys run returns, in order), top_k and trajectory_reals (one trajectory's engine scratch, one trajectory a thread); with LanczosOptions, lanczos_reals (one solve's scratch)
        """
    def run(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        hyper: dict,
        config: dict,
        offset: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> dict:
        """
        (B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first trajectory index -> dict of records
        """
    def sgd(
        self,
        w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
        wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        steps: typing.SupportsInt | typing.SupportsIndex,
        record_every: typing.SupportsInt | typing.SupportsIndex,
        replacement: bool,
        seed: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        max_loss: typing.SupportsFloat | typing.SupportsIndex,
    ) -> dict: ...
    def third(
        self,
        W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
        V: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    ) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.uint8]]:
        """
        (B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))
        """
    @property
    def _layout(self) -> dict: ...
    @property
    def dim(self) -> int: ...
    @property
    def group_bounds(self) -> typing.Any: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """
    @property
    def n_groups(self) -> int: ...

class LoadedLibrary_f32:
    """
    The table of a run-time compiled model (loaded_abi.hpp)
    """
    def Model(self, data: dict) -> LoadedCore_f32:
        """
        The model's struct bound to `data` {field: value}
        """
    def __init__(self, address: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        From the address pysharp_loaded_table() returned
        """
    @property
    def DTYPE(self) -> str: ...
    @property
    def FIELDS(self) -> list: ...
    @property
    def KIND(self) -> str: ...
    @property
    def MODEL_NAME(self) -> str: ...

def _bn_linreg_loss_grad_path(
    path: str,
    Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
) -> tuple: ...
def _bn_linreg_loss_grad_path_f32(
    path: str,
    Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
) -> tuple: ...
def _lane_math(
    name: str, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
) -> numpy.typing.NDArray[numpy.float64]: ...
def _tile_bn_linreg_fits(
    d: typing.SupportsInt | typing.SupportsIndex, n: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN linear regression with d coordinates and n samples runs on the tile: here, whether the emulation is compiled for (d, n).
    """

def _tile_bn_linreg_gd_wd(
    Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    W0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    placement: typing.Annotated[numpy.typing.ArrayLike, numpy.int64] | None = None,
    v1: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple:
    """
    GD+WD on BN linear regression, 8 trajectories per tile: (w_final (B, d), loss (R, B), norm2 (R, B), diverged (B,), diverged_step (B,), eff_lr (R, B), grad_norm (R, B), top_grad (R, B): ||w|| v1 . grad L(w), given unit vectors v1 (B, d); (0, B) without).
    """

def _tile_bn_linreg_loss_grad(
    Xc: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
) -> tuple:
    """
    (loss (B,), grad (B, d), ok (B,)) of BN linear regression from the tile's step.
    """

def _tile_bn_mc_fits(
    D: typing.SupportsInt | typing.SupportsIndex, N: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN matrix completion with D coordinates and N observations runs on the tile (an H100's or H200's shared memory per block).
    """

def _tile_bn_mc_gd_wd(
    rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    m1: typing.SupportsInt | typing.SupportsIndex,
    m2: typing.SupportsInt | typing.SupportsIndex,
    r: typing.SupportsInt | typing.SupportsIndex,
    W0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    v1: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple:
    """
    GD+WD on BN matrix completion, one thread per trajectory: the same tuple as _tile_bn_linreg_gd_wd.
    """

def _tile_bn_mc_warp_fits(
    D: typing.SupportsInt | typing.SupportsIndex, N: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN matrix completion with D coordinates and N observations runs on the warp tile (an H100's or H200's shared memory per block).
    """

def _tile_bn_mc_warp_gd_wd(
    rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    u: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    scale: typing.SupportsFloat | typing.SupportsIndex,
    m1: typing.SupportsInt | typing.SupportsIndex,
    m2: typing.SupportsInt | typing.SupportsIndex,
    r: typing.SupportsInt | typing.SupportsIndex,
    W0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    v1: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple:
    """
    GD+WD on BN matrix completion, one warp per trajectory: the same tuple as _tile_bn_linreg_gd_wd.
    """

def _tile_bn_mc_warp_terms(
    rows: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    cols: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    m1: typing.SupportsInt | typing.SupportsIndex,
    m2: typing.SupportsInt | typing.SupportsIndex,
    r: typing.SupportsInt | typing.SupportsIndex,
) -> tuple:
    """
    (pass_start (ceil(D / 32) + 1,), obs (T,), other (T,)): the gradient terms of BN matrix completion's warp tile, lane l of pass p reading pass_start[p] + 32 j + l.
    """

def _tile_mma_m8n8k4(
    A: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    B: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    C: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
) -> numpy.typing.NDArray[numpy.float64]:
    """
    A @ B + C through the fragments of mma.m8n8k4 f64 on the emulated warp.
    """

def _tile_toy3d_gd_wd(
    c: typing.SupportsFloat | typing.SupportsIndex,
    W0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    v1: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple:
    """
    GD+WD on Toy3D, one thread per trajectory: the same tuple as _tile_bn_linreg_gd_wd.
    """

def _tridiagonal_eigenvectors(
    d: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    e: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    theta: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
) -> numpy.typing.NDArray[numpy.float64]: ...
def _tridiagonal_eigh(
    d: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    e: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    first_row: typing.SupportsInt | typing.SupportsIndex,
    rows: typing.SupportsInt | typing.SupportsIndex,
    lanes: bool,
) -> tuple: ...
def _tridiagonal_top_test(
    d: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    e: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lanes: bool,
) -> tuple: ...
def _tridiagonal_top_test_f32(
    d: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    e: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    lanes: bool,
) -> tuple: ...
@typing.overload
def bn_linreg_batch_loss_grad(
    core: BNLinearRegression_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    idx: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
) -> tuple[
    numpy.typing.NDArray[numpy.float64],
    numpy.typing.NDArray[numpy.float64],
    numpy.typing.NDArray[numpy.uint8],
]:
    """
    Ghost-BN loss and gradient of batch idx (B,): (L_I (P,), grad L_I (P, d), ok (P,))
    """

@typing.overload
def bn_linreg_batch_loss_grad(
    core: BNLinearRegression_f32,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    idx: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
) -> tuple[
    numpy.typing.NDArray[numpy.float32],
    numpy.typing.NDArray[numpy.float32],
    numpy.typing.NDArray[numpy.uint8],
]:
    """
    Ghost-BN loss and gradient of batch idx (B,): (L_I (P,), grad L_I (P, d), ok (P,))
    """

@typing.overload
def bn_linreg_jacobians(
    core: BNLinearRegression_f64, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64]
) -> tuple[
    numpy.typing.NDArray[numpy.float64],
    numpy.typing.NDArray[numpy.float64],
    numpy.typing.NDArray[numpy.uint8],
]:
    """
    (P, d) -> (grad_w p (P, n, d), grad_x p (P, n, d), ok (P,))
    """

@typing.overload
def bn_linreg_jacobians(
    core: BNLinearRegression_f32, W: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]
) -> tuple[
    numpy.typing.NDArray[numpy.float32],
    numpy.typing.NDArray[numpy.float32],
    numpy.typing.NDArray[numpy.uint8],
]:
    """
    (P, d) -> (grad_w p (P, n, d), grad_x p (P, n, d), ok (P,))
    """

@typing.overload
def bn_linreg_sgd(
    core: BNLinearRegression_f64,
    w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    replacement: bool,
    seed: typing.SupportsInt | typing.SupportsIndex,
    offset: typing.SupportsInt | typing.SupportsIndex,
    max_loss: typing.SupportsFloat | typing.SupportsIndex,
) -> dict:
    """
    Mini-batch SGD+WD with ghost BN (each batch's own statistics) on BN linear regression
    """

@typing.overload
def bn_linreg_sgd(
    core: BNLinearRegression_f32,
    w0: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    lr: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    batch: typing.Annotated[numpy.typing.ArrayLike, numpy.int32],
    wd: typing.Annotated[numpy.typing.ArrayLike, numpy.float32],
    steps: typing.SupportsInt | typing.SupportsIndex,
    record_every: typing.SupportsInt | typing.SupportsIndex,
    replacement: bool,
    seed: typing.SupportsInt | typing.SupportsIndex,
    offset: typing.SupportsInt | typing.SupportsIndex,
    max_loss: typing.SupportsFloat | typing.SupportsIndex,
) -> dict:
    """
    Mini-batch SGD+WD with ghost BN (each batch's own statistics) on BN linear regression
    """

def build_info() -> dict: ...
def lanczos_callable(
    matvec: collections.abc.Callable,
    dim: typing.SupportsInt | typing.SupportsIndex,
    options: dict,
    start: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple: ...
def linear_sgd(
    A: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    X0: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    lr: typing.SupportsFloat | typing.SupportsIndex,
    batch: typing.SupportsInt | typing.SupportsIndex,
    replacement: bool,
    seed: typing.SupportsInt | typing.SupportsIndex,
    offset: typing.SupportsInt | typing.SupportsIndex,
    t0: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
) -> tuple[numpy.typing.NDArray[numpy.float64], numpy.typing.NDArray[numpy.float64]]:
    """
    Linearised SGD x <- x - (lr/B) sum_I a_i a_i.x for steps t0.. of each run: (unit final states (runs, D), log growth (runs,))
    """

def max_threads() -> int: ...
def set_num_threads(n: typing.SupportsInt | typing.SupportsIndex) -> None: ...
def sgd_batches(
    n: typing.SupportsInt | typing.SupportsIndex,
    batch: typing.SupportsInt | typing.SupportsIndex,
    replacement: bool,
    seed: typing.SupportsInt | typing.SupportsIndex,
    trajectory: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
) -> numpy.typing.NDArray[numpy.int32]:
    """
    The SGD engine's batches of one trajectory, (steps, batch) indices: for oracles and peers
    """

@typing.overload
def slq(
    model: BNLinearRegression_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: BNMatrixCompletion_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: BNTwoLayerNet_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: Toy3D_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: LinearRegression_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: TwoLayerNet_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

@typing.overload
def slq(
    model: LoadedCore_f64,
    W: typing.Annotated[numpy.typing.ArrayLike, numpy.float64],
    n_probes: typing.SupportsInt | typing.SupportsIndex,
    steps: typing.SupportsInt | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> dict:
    """
    Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, beta, nodes, weights (B, P, steps), count (B, P), ok (B,)
    """

BUILTIN_MODELS: tuple = ("BNLinearRegression", "BNMatrixCompletion", "BNTwoLayerNet", "Toy3D")
LANCZOS_MAX_ITER: int = 1024
LOADED_ABI_SIZES_f32: tuple = (4, 64, 64, 40, 160)
LOADED_ABI_SIZES_f64: tuple = (8, 64, 64, 40, 160)
LOADED_ABI_VERSION: int = 3
METHODS: dict = {
    "gd_wd": 0,
    "pgd": 1,
    "pgd_adaptive": 2,
    "scalar_rmsprop": 3,
    "pgd_quasi_rmsprop": 4,
}
RECORDS: tuple = (
    ("loss", "loss", "real", "record", "", ""),
    ("norm2", "norm2", "real", "record", "", ""),
    ("eff_lr", "eff_lr", "real", "record", "", ""),
    ("grad_norm", "grad_norm", "real", "record", "", ""),
    ("top_grad", "top_grad", "real", "record", "", "sharpness"),
    ("sharpness", "sharpness", "real", "sharpness", "", ""),
    ("eos_ratio", "eos_ratio", "real", "sharpness", "", ""),
    ("sharpness_converged", "sharpness_converged", "u8", "sharpness", "", ""),
    ("theta", "theta", "real", "theta", "D", ""),
    ("w", "w_final", "real", "", "D", ""),
    ("diverged", "diverged", "u8", "", "", ""),
    ("diverged_step", "diverged_step", "i64", "", "", ""),
    ("group_norm2", "group_norm2", "real", "record", "G", "groups"),
    ("top_eigenvalues", "top_eigs", "real", "sharpness", "k", "top_k"),
)
SAFE_NORM2: dict = {
    "float64": (4.909093465297727e-91, 2.037035976334486e90),
    "float32": (5.960464477539063e-08, 16777216.0),
}
_TILE_BN_LINREG_SHAPES: list = [(40, 20), (100, 200), (13, 11)]
__version__: str = "0.1.0"
