"""
pysharp CUDA kernels, with the interface of pysharp._core (see pysharp.backends).
"""

# Generated from the built module by pybind11-stubgen, then `ruff format`: do not edit.
# Regenerate after changing the bindings: python tools/stubs.py (--check in CI).

from __future__ import annotations

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
    "METHODS",
    "Toy3D_f32",
    "Toy3D_f64",
    "device_error",
    "device_info",
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
    def dim(self) -> int: ...
    @property
    def model_address(self) -> int:
        """
        Address of the model's view, valid while this object lives: what pysharp.jax's FFI handlers (cpu/jax_ffi.hpp) read
        """

def _tile_bn_linreg_fits(
    d: typing.SupportsInt | typing.SupportsIndex, n: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN linear regression with d coordinates and n samples runs on the tile: a kernel compiled for (d, n) (_TILE_BN_LINREG_SHAPES) and FP64 mma on this device.
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
    v1: typing.Annotated[numpy.typing.ArrayLike, numpy.float64] | None = None,
) -> tuple:
    """
    GD+WD on BN linear regression on the device's tile kernel: (w_final (B, d), loss (R, B), norm2 (R, B), diverged (B,), diverged_step (B,), eff_lr (R, B), grad_norm (R, B), top_grad (R, B): ||w|| v1 . grad L(w), given unit vectors v1 (B, d); (0, B) without).
    """

def _tile_bn_mc_fits(
    D: typing.SupportsInt | typing.SupportsIndex, N: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN matrix completion with D coordinates and N observations runs on the tile (the current device's shared memory per block).
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
    GD+WD on BN matrix completion on the device's tile kernel: the same tuple as _tile_bn_linreg_gd_wd.
    """

def _tile_bn_mc_warp_fits(
    D: typing.SupportsInt | typing.SupportsIndex, N: typing.SupportsInt | typing.SupportsIndex
) -> bool:
    """
    Whether BN matrix completion with D coordinates and N observations runs on the warp tile (the current device's shared memory per block).
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
    GD+WD on BN matrix completion on the device's warp tile kernel (a warp per trajectory): the same tuple as _tile_bn_linreg_gd_wd.
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
    GD+WD on Toy3D on the device's tile kernel: the same tuple as _tile_bn_linreg_gd_wd.
    """

def device_error() -> str:
    """
    Empty when a CUDA device can run the kernels, else the reason.
    """

def device_info() -> dict: ...

METHODS: dict = {
    "gd_wd": 0,
    "pgd": 1,
    "pgd_adaptive": 2,
    "scalar_rmsprop": 3,
    "pgd_quasi_rmsprop": 4,
}
_TILE_BN_LINREG_SHAPES: list = [(40, 20), (100, 200)]
