"""The trajectory engine's update rules, one row each: the single list every layer reads.

``METHODS`` is the one place a method is declared. From it come

- the C++ ``enum class Method`` and its properties (csrc/include/pysharp/engine/methods.hpp,
  written by ``python tools/gen_methods.py``; CI fails when that file is stale),
- ``pysharp._engine.Method`` (the values the compiled modules read) and the names
  ``pysharp._core.METHODS`` exports,
- every question the Python layer asks of a method (does it run on the sphere, use weight
  decay, have BN linear regression's reduced update, run on the Numba port, get swept, have
  a central flow), instead of string tests scattered over the modules.

Adding a method: its branch in engine/trajectory.hpp, a row here (then the tool), its public
``run_*`` function in pysharp/dynamics.py and its test; docs/tutorials/own_method.rst walks
through it. This module imports nothing from pysharp (the generator loads it by path).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    """One update rule of the trajectory engine.

    Attributes
    ----------
    name : str
        Its name everywhere ("gd_wd"): the C++ enumerator, ``Trajectory.method``, sweeps.
    code : int
        Value of the C++ enumerator (and of ``pysharp._engine.Method``); never reused.
    label : str
        Its name in titles and tables ("GD+WD").
    rule : str
        The update in one line (the generated header's comment).
    runner : str
        The public function that runs it (``pysharp.<runner>``).
    hyper : tuple of str
        The per-trajectory hyperparameters it reads, by name (keys of ``HYPERPARAMETERS``):
        exactly these are given to :func:`pysharp.dynamics.run_method` and a backend's
        ``run``.
    on_sphere : bool
        Iterates stay on the unit sphere: the start is normalised and the step size is
        ``eta``, the effective LR.
    reduced : bool
        BN linear regression's exact reduced (singular-basis) update exists for it.
    adaptive_step : bool
        The step size depends on the trajectory's state, so the last step's size must be
        read from ``eff_lr`` recorded at the last step (a sweep's record_every divides steps).
    options : tuple of str
        The scalar engine options (``EngineConfig`` fields) it reads besides the common ones.
    numba : bool
        The Numba port runs it (else the fallback refuses it by name).
    sweep : bool
        ``pysharp.sweep`` and ``pysharp sweep`` run it over the lr x wd x seed x init_norm grid.
    central_flow : bool
        ``pysharp.CentralFlow`` models it.
    """

    name: str
    code: int
    label: str
    rule: str
    runner: str
    hyper: tuple[str, ...] = ("lr", "wd")
    on_sphere: bool = False
    reduced: bool = False
    adaptive_step: bool = False
    options: tuple[str, ...] = ()
    numba: bool = True
    sweep: bool = False
    central_flow: bool = False

    @property
    def uses_wd(self) -> bool:
        """It decays the weights: lr wd < 1 is required, and a sweep's grid must give wd."""
        return "wd" in self.hyper


#: The engine's per-trajectory hyperparameters: each a (B,) array, read by the methods whose
#: ``hyper`` names it (the C++ ``Hyperparameters`` struct has one field per entry, in order).
#: Value: (meaning, lower bound) with bound "> 0" or ">= 0".
HYPERPARAMETERS: dict[str, tuple[str, str]] = {
    "lr": ("GD+WD's learning rate (pgd_adaptive: the run it follows)", "> 0"),
    "wd": ("weight decay, lr wd < 1", ">= 0"),
    "eta": ("effective LR on the sphere: pgd's, or the first", "> 0"),
    "c": ("Quasi-RMSprop's coefficient of ||g||^2", "> 0"),
}

_ROWS = (
    MethodSpec("gd_wd", 0, "GD+WD", "w+ = (1 - lr wd) w - lr grad L(w)", "run_gd_wd",
               reduced=True, sweep=True, central_flow=True),
    MethodSpec("pgd", 1, "projected GD",
               "theta+ = Pi(theta - eta grad L(theta)), constant eta", "run_pgd",
               hyper=("eta",), on_sphere=True, sweep=True),
    MethodSpec("pgd_adaptive", 2, "projected GD with GD+WD's LR",
               "as pgd, eta follows the GD+WD recursion (Lemma 3.1) from eta_0 = eta", "run_pgd",
               hyper=("eta", "lr", "wd"), on_sphere=True, adaptive_step=True),
    MethodSpec("scalar_rmsprop", 3, "scalar RMSprop",
               "v+ = b v + (1-b) ||g||^2, w+ = (1 - lr wd) w - lr g / (sqrt(v+) + eps)",
               "run_scalar_rmsprop", reduced=True, adaptive_step=True,
               options=("rms_beta", "rms_eps"), sweep=True, central_flow=True),
    MethodSpec("pgd_quasi_rmsprop", 4, "projected GD with a Quasi-RMSprop LR",
               "as pgd, eta follows a Quasi-RMSprop scheduler (trajectory.hpp)", "run_pgd",
               hyper=("eta", "c"), on_sphere=True, adaptive_step=True,
               options=("rms_beta", "qr_kappa"), numba=False),
)

#: Every method of the engine by name, in code order.
METHODS: dict[str, MethodSpec] = {m.name: m for m in sorted(_ROWS, key=lambda m: m.code)}


def method_spec(name: str) -> MethodSpec:
    """The row of the method called ``name``; a ValueError naming the choices otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; choose one of {list(METHODS)}") from None
