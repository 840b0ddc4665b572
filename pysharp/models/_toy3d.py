from __future__ import annotations

import functools

import numpy as np

from .._engine.validation import as_real
from ..reference import Toy3DReference
from ._base import ScaleInvariantModel, check_data_range
from ._registry import ModelEntry, register


class Toy3D(ScaleInvariantModel):
    """The 3-D toy scale-invariant loss L(w) = (1 + c z^2)(x - y)^2, (x, y, z) = w/||w||.

    Its minimisers on the unit sphere form the great circle Gamma = {x = y};
    on Gamma the spherical sharpness is 4 (1 + c z^2), smallest at
    (1/sqrt 2, 1/sqrt 2, 0), where the sharpness-reduction flow ends.

    Parameters
    ----------
    c : float, >= 0
        Strength of the sharpness variation along Gamma; at most 2^400 (2^40
        for float32 kernels): the loss grows like c, and beyond, its derivatives
        or the Lanczos solves of sharpness would overflow.
    """

    _declared_as = ("toy3d.hpp", "Toy3D")

    _undefined_reason = "w is zero, where the loss is undefined"

    def __init__(self, c: float = 10.0) -> None:
        super().__init__()
        self.c = as_real(c, "c", minimum=0.0)
        self._check_c(np.float64)

    @property
    def dim(self) -> int:
        return 3

    def _check_c(self, dtype) -> None:
        if self.c > 0:
            check_data_range(float(np.log2(self.c)), dtype, "c", "choose a smaller c",
                             lower=False)

    def _make_core(self, suffix, module):
        self._check_c(np.float64 if suffix == "_f64" else np.float32)
        return getattr(module, "Toy3D" + suffix)(self.c)

    def _tile_kernel(self, module):
        return functools.partial(module._tile_toy3d_gd_wd, self.c)

    def _numba_params(self) -> tuple:
        from .._backends._numba_kernels import TOY3D, params  # lazy: numba is optional
        return params(TOY3D, extra=self.c)

    def _reference(self):
        return Toy3DReference(self.c)

    def spec(self) -> dict:
        return {"model": "toy3d", "c": self.c}


register(ModelEntry("toy3d", Toy3D, Toy3D,
                    plot_metrics=("eos_entry_step", "sharpness_drop", "final_sharpness")))
