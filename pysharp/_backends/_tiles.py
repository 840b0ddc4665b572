"""The fused GD+WD tiles as the trajectory engine's ``run``, where they apply.

A tile run (``csrc/include/pysharp/tile/``: one persistent launch runs every step, the
iterate in registers or shared memory) records what the engine records for GD+WD without
sharpness tracking: the loss, ||w||^2, the effective LR and ||grad L(theta)|| at the record
steps, the final iterate and the divergence flags. A backend whose ``Backend.tiles`` names a
module (``cuda``: ``pysharp._cuda``) runs such a batch there when the model has a tile
(``_tile_kernel``: Toy3D, BN matrix completion up to a size, BN linear regression at the
compiled shapes) and the generic engine otherwise. ``pysharp._core`` has the same
``_tile_*`` functions, emulated on the CPU, which is how the tests check this path without
a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._engine import EngineConfig, Method


def applies(config: EngineConfig, dtype) -> bool:
    """Whether a tile can run ``config``: plain GD+WD in float64, the direct update, no
    sharpness, snapshots, jitter or top-k (what a tile does not record)."""
    return (config.method == Method.GD_WD and np.dtype(dtype) == np.float64
            and not (config.sharpness_every or config.theta_every or config.jitter
                     or config.top_k or config.reduced))


def tile_run(model, config: EngineConfig, W0: np.ndarray, hyper: dict[str, np.ndarray],
             module: Any) -> dict[str, np.ndarray] | None:
    """The records of ``model``'s tile in ``module`` from the starts W0 (B, D), as the
    engine's ``run`` returns them; None where no tile applies."""
    kernel = model._tile_kernel(module) if applies(config, W0.dtype) else None
    if kernel is None:
        return None
    w, loss, norm2, diverged, step, eff_lr, grad_norm = kernel(
        W0, hyper["lr"], hyper["wd"], config.steps, config.record_every)
    B, D = W0.shape
    nothing = np.zeros((0, B))  # no sharpness steps, no snapshots
    return {"loss": loss, "norm2": norm2, "eff_lr": eff_lr, "grad_norm": grad_norm,
            "top_grad": nothing, "sharpness": nothing, "eos_ratio": nothing,
            "sharpness_converged": np.zeros((0, B), np.uint8),
            "theta": np.zeros((0, B, D)), "w": w, "diverged": diverged,
            "diverged_step": step}
