"""The fused GD+WD tiles as the trajectory engine's ``run``, where they apply.

A tile run (``csrc/include/pysharp/tile/``: one persistent launch runs every step, the
iterate in registers or shared memory) records what the engine records for GD+WD: the loss,
||w||^2, the effective LR and ||grad L(theta)|| at the record steps, the final iterate and the
divergence flags. A backend whose ``Backend.tiles`` names a module (``cuda``:
``pysharp._cuda``; ``cupy``) runs such a batch there when the model has a tile
(``_tile_kernel``: Toy3D, BN matrix completion up to a size, BN linear regression at the
shapes the module has) and the generic engine otherwise. ``pysharp._core`` has the same
``_tile_*`` functions, emulated on the CPU, which is how the tests check this path without
a GPU.

Sharpness tracking runs the tiles in segments of ``sharpness_every`` steps: at each
sharpness step the engine's own Lanczos (the backend's ``lanczos``, keyed as the engine
keys it: stream the trajectory's index, counter the step, the last eigenvector as warm
start, its sign kept continuous) on the segment's first iterate, then the tile from there,
recording ``top_grad`` against that eigenvector. The records are the engine's, step for
step; only the arithmetic of the step (the tile's) and the Lanczos' lane layout differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._engine import EngineConfig, Method
from .._engine.validation import rows_in_safe_range

_RECORDS = ("loss", "norm2", "eff_lr", "grad_norm", "top_grad")


def applies(config: EngineConfig, dtype) -> bool:
    """Whether a tile can run ``config``: plain GD+WD in float64, the direct update, no
    snapshots, jitter or top-k (what a tile does not record); sharpness tracking or not."""
    return (config.method == Method.GD_WD and np.dtype(dtype) == np.float64
            and not (config.theta_every or config.jitter or config.top_k or config.reduced))


def tile_run(model, config: EngineConfig, W0: np.ndarray, hyper: dict[str, np.ndarray],
             module: Any, core: Any = None, first_trajectory: int = 0
             ) -> dict[str, np.ndarray] | None:
    """The records of ``model``'s tile in ``module`` from the starts W0 (B, D), as the
    engine's ``run`` returns them; None where no tile applies.

    ``core`` (the model's core on the same backend, ``model._core(float64, backend)``) runs
    the Lanczos of a run with ``sharpness_every > 0``; without it such a run gets None.
    ``first_trajectory``: the index of row 0, which keys the Lanczos' random starts as the
    engine's ``offset`` does.
    """
    kernel = model._tile_kernel(module) if applies(config, W0.dtype) else None
    if kernel is None or (config.sharpness_every and core is None):
        return None
    if not rows_in_safe_range(W0):  # the tiles do not rescale; the generic engine does
        return None
    if config.sharpness_every:
        return _segmented(kernel, core, config, W0, hyper, first_trajectory)
    w, loss, norm2, diverged, step, eff_lr, grad_norm, _ = kernel(
        W0, hyper["lr"], hyper["wd"], config.steps, config.record_every)
    B, D = W0.shape
    nothing = np.zeros((0, B))  # no sharpness steps, no snapshots
    return {"loss": loss, "norm2": norm2, "eff_lr": eff_lr, "grad_norm": grad_norm,
            "top_grad": nothing, "sharpness": nothing, "eos_ratio": nothing,
            "sharpness_converged": np.zeros((0, B), np.uint8),
            "theta": np.zeros((0, B, D)), "w": w, "diverged": diverged,
            "diverged_step": step}


_OUTPUTS = ("w", "loss", "norm2", "diverged", "step", "eff_lr", "grad_norm", "top_grad")


def _segmented(kernel, core, config: EngineConfig, W0: np.ndarray,
               hyper: dict[str, np.ndarray], first_trajectory: int) -> dict[str, np.ndarray]:
    """A tile run with sharpness every ``config.sharpness_every`` steps (see the module's
    docstring). Segment j covers the steps from t = j every to the next sharpness step
    (exclusive; the last segment to ``steps``, inclusive) and starts with the Lanczos at
    w_t. A tile call records at its own steps 0, record_every, ..., so the segment's records
    (the multiples of record_every in it) come from a call that starts on the first of them;
    where t is not one, a call before it takes the rows there and records only step t (whose
    ||w||^2 and effective LR the sharpness record needs). Only the trajectories still
    running enter a call."""
    B, D = W0.shape
    T, every, rec_every = config.steps, config.sharpness_every, config.record_every
    n_sharp = T // every + 1
    rec = {name: np.full((T // rec_every + 1, B), np.nan) for name in _RECORDS}
    sharpness, eos_ratio = np.full((n_sharp, B), np.nan), np.full((n_sharp, B), np.nan)
    converged = np.zeros((n_sharp, B), np.uint8)
    w = np.array(W0, dtype=np.float64, order="C")
    v1 = np.zeros((B, D))
    diverged, diverged_step = np.zeros(B, np.uint8), np.full(B, -1, np.int64)
    lr, wd = np.asarray(hyper["lr"], np.float64), np.asarray(hyper["wd"], np.float64)
    options = config.lanczos.to_core() | {"k": 1}

    def call(rows, start: int, steps: int, record_every: int, top_grad: bool):
        """The tile on ``rows`` from step ``start``: its outputs by name, and the rows still
        running after it (w and the divergence flags updated)."""
        out = dict(zip(_OUTPUTS, kernel(w[rows], lr[rows], wd[rows], steps, record_every,
                                        v1=v1[rows] if top_grad else None)))
        w[rows] = out["w"]
        stopped = out["diverged"].astype(bool)
        diverged[rows[stopped]] = 1
        diverged_step[rows[stopped]] = start + out["step"][stopped]
        return out, rows[~stopped]

    live = np.arange(B)
    for j in range(n_sharp):
        if live.size == 0:
            break
        t, final = j * every, j == n_sharp - 1
        end = T if final else t + every
        evals, evecs, _, _, conv, ok = core.lanczos(
            w[live], options, v1[live] if j else None,
            streams=(first_trajectory + live).astype(np.uint64), counter=t)
        lam, vec = evals[:, 0], evecs[:, 0, :]
        if j:  # the engine's sign: continuous, so that top_grad shows the oscillation
            vec = np.where((np.einsum("bd,bd->b", vec, v1[live]) < 0)[:, None], -vec, vec)
        solved = ok.astype(bool) & np.isfinite(lam)
        diverged[live[~solved]], diverged_step[live[~solved]] = 1, t  # frozen at w_t
        run, lam, conv = live[solved], lam[solved], conv[solved]
        if run.size == 0:
            break
        v1[run] = vec[solved]
        first_rec = -(-t // rec_every) * rec_every  # the segment's first record step
        at_t = None  # the outputs of the call that recorded step t
        live = run
        if first_rec > t:  # to the first record step, or through the segment
            at_t, live = call(run, t, min(first_rec, end) - t, min(first_rec, end) - t + 1,
                              False)
        if live.size and (first_rec <= end if final else first_rec < end):
            entered = live
            out, live = call(entered, first_rec, end - first_rec, rec_every, True)
            # the records before end; the last segment's through end
            kept = (end - first_rec) // rec_every + 1 if final else \
                (end - first_rec - 1) // rec_every + 1
            r0 = first_rec // rec_every
            for name in _RECORDS:
                rec[name][r0:r0 + kept, entered] = out[name][:kept]
            at_t = out if at_t is None else at_t
        # S(w_t) = ||w_t||^2 lambda_1 and eff_lr S, from the record of step t; a row the
        # tile flags at t (an undefined loss there) keeps NaN and "not converged".
        norm2_t, eff_t = at_t["norm2"][0], at_t["eff_lr"][0]
        defined = np.isfinite(norm2_t)
        sharpness[j, run] = np.where(defined, lam * norm2_t, np.nan)
        eos_ratio[j, run] = eff_t * sharpness[j, run]
        converged[j, run] = np.where(defined, conv, 0)
    return {**rec, "sharpness": sharpness, "eos_ratio": eos_ratio,
            "sharpness_converged": converged, "theta": np.zeros((0, B, D)), "w": w,
            "diverged": diverged, "diverged_step": diverged_step}
