"""Which kind of pysharp model a tool was given, refused with a message that says what to use."""

from __future__ import annotations

from ._base import ScaleInvariantModel
from ._square_loss import SquareLossModel
from ._xla_square_loss import XlaSquareLossModel


def require_scale_invariant(model, tool: str, instead: str) -> None:
    """Raise TypeError unless ``model`` is a ScaleInvariantModel.

    A square-loss model (LinearRegression, TwoLayerNet, a square_loss_from_jax network) is a
    pysharp model too, so
    its refusal says why (``tool`` needs scale invariance) and what to use
    (``instead``); anything else gets "model must be a pysharp model".
    """
    if isinstance(model, ScaleInvariantModel):
        return
    name = type(model).__name__
    if isinstance(model, (SquareLossModel, XlaSquareLossModel)):
        raise TypeError(f"{tool} needs a scale-invariant model; {name} is a square-loss model, "
                        f"not defined up to scale: {instead}")
    raise TypeError(f"model must be a pysharp model, got {name}")


def require_sample_jacobians(model, what: str) -> None:
    """Raise TypeError unless ``model`` gives the per-sample Jacobians of SGD's stability theory.

    Such a model (LinearRegression, TwoLayerNet, a loaded square-loss model,
    BNLinearRegression, a square_loss_from_jax network) says so itself: ``outputs`` (k),
    ``jacobians_by`` ("core" or "xla"), ``param_gradients(w)`` and ``jacobian_rows(w)``,
    (B, n k, D) for points (B, D). ``what`` names the caller in the message.
    """
    if all(hasattr(model, a) for a in ("outputs", "jacobians_by", "param_gradients",
                                       "jacobian_rows")):
        return
    raise TypeError(f"{what}: model must be a pysharp LinearRegression, TwoLayerNet, "
                    "loaded square-loss model, BNLinearRegression or square_loss_from_jax "
                    f"model (one with per-sample Jacobians), got {type(model).__name__}")


def runs_sgd(model) -> bool:
    """Whether ``model`` (an instance or a class) runs mini-batch SGD (``pysharp.run_sgd``).

    Such a model says so itself: ``_run_sgd(W0, lr, batch, wd, steps, record_every,
    replacement, seed, first_trajectory, max_loss)`` (its engine), ``sgd_min_batch`` (the
    smallest batch and why) and ``jacobians_by`` (where it runs: "core" or "xla").
    """
    return all(hasattr(model, a) for a in ("_run_sgd", "sgd_min_batch", "jacobians_by"))


def require_sgd(model, what: str) -> None:
    """Raise TypeError unless ``model`` runs mini-batch SGD (:func:`runs_sgd`)."""
    if runs_sgd(model):
        return
    raise TypeError(f"{what}: model must be a pysharp square-loss model (LinearRegression, "
                    f"TwoLayerNet, square_loss_from_jax) or BNLinearRegression, got "
                    f"{type(model).__name__}")
