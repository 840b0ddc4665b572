"""The update rules, one row each: the single list every layer reads.

``ALL_METHODS`` is the one place a method is declared; a row's ``engine`` (a key of
``ENGINES``) says what runs it: the trajectory engine (``run_method``, the C++
``TrajectoryRunner``) or the core's mini-batch SGD (``run_minibatch``). ``METHODS``, the
trajectory engine's rows, is what the compiled modules know. From the table come

- the C++ ``enum class Method`` and its properties (csrc/include/pysharp/engine/methods.hpp,
  written by ``python tools/gen_methods.py``; CI fails when that file is stale),
- ``pysharp._engine.Method`` (the values the compiled modules read) and the names
  ``pysharp._core.METHODS`` exports,
- every question the Python layer asks of a method (does it run on the sphere, use weight
  decay, have BN linear regression's reduced update, run on the Numba port, get swept, have
  a central flow), instead of string tests scattered over the modules.

- for every row, what a sweep asks of it: its grid axes (its ``hyper``), the hyperparameters
  a caller may leave out, the ``RunOptions`` fields it reads (its engine's and its own), so
  that SGD is swept by the same code as GD+WD.

Adding a method: its branch in engine/trajectory.hpp, a row here (then the tool), its public
``run_*`` function in pysharp/dynamics.py and its test; docs/tutorials/adding_a_method.rst
walks through it. This module imports nothing from pysharp (the generator loads it by path).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """What runs rows of the table, and what every row it runs reads.

    Attributes
    ----------
    name : str
        Its key in ``ENGINES`` and a row's ``engine``.
    runner : str
        The function, ``pysharp.<module>.<function>``, that runs one of its rows as
        ``runner(model, w0, hyper, method=..., options=RunOptions(...))``.
    hyper : dict
        The per-trajectory hyperparameters its rows may read: name -> (meaning, lower
        bound), the bound "> 0", ">= 0" or ">= 1, whole" (a count).
    options : tuple of str
        The ``RunOptions`` fields (pysharp._engine.options) it reads for every row; a
        row's own ``options`` add to them, and a runner refuses any other field set away
        from its default.
    core_only : bool
        Only the compiled core runs it (no backend choice).
    """

    name: str
    runner: str
    hyper: dict[str, tuple[str, str]]
    options: tuple[str, ...]
    core_only: bool = False


@dataclass(frozen=True)
class MethodSpec:
    """One update rule.

    Attributes
    ----------
    name : str
        Its name everywhere ("gd_wd"): the C++ enumerator, ``Trajectory.method``, sweeps.
    code : int or None
        Value of the C++ enumerator (and of ``pysharp._engine.Method``); never reused.
        None for a row the trajectory engine does not run (no enumerator).
    label : str
        Its name in titles and tables ("GD+WD").
    rule : str
        The update in one line (the generated header's comment).
    runner : str
        The public function that runs it (``pysharp.<runner>``).
    hyper : tuple of str
        The per-trajectory hyperparameters it reads, by name (keys of its engine's
        ``hyper``): exactly these are given to its engine's runner (for the trajectory
        engine :func:`pysharp.dynamics.run_method` and a backend's ``run``). A sweep's
        grid axes are these, ``eta`` swept as ``lr`` (see ``grid_axes``).
    optional : tuple of str
        Of ``hyper``, those a caller may leave out (then 0): SGD's weight decay.
    on_sphere : bool
        Iterates stay on the unit sphere: the start is normalised and the step size is
        ``eta``, the effective LR.
    reduced : bool
        BN linear regression's exact reduced (singular-basis) update exists for it.
    adaptive_step : bool
        The step size depends on the trajectory's state, so the last step's size must be
        read from ``eff_lr`` recorded at the last step (a sweep's record_every divides steps).
    options : tuple of str
        The ``RunOptions`` fields it reads besides its engine's (``Engine.options``); for
        the trajectory engine, scalar ``EngineConfig`` fields.
    numba : bool
        The Numba port runs it (else the fallback refuses it by name).
    sweep : bool
        ``pysharp.sweep`` and ``pysharp sweep`` run it over a grid of its ``grid_axes``.
    central_flow : bool
        ``pysharp.CentralFlow`` models it.
    engine : str
        What runs it, a key of ``ENGINES``: "trajectory" (the rows the C++ engine and
        ``METHODS`` hold) or "minibatch".
    """

    name: str
    code: int | None
    label: str
    rule: str
    runner: str
    hyper: tuple[str, ...] = ("lr", "wd")
    optional: tuple[str, ...] = ()
    on_sphere: bool = False
    reduced: bool = False
    adaptive_step: bool = False
    options: tuple[str, ...] = ()
    numba: bool = True
    sweep: bool = False
    central_flow: bool = False
    engine: str = "trajectory"

    @property
    def uses_wd(self) -> bool:
        """It decays the weights: lr wd < 1 is required."""
        return "wd" in self.hyper

    @property
    def required(self) -> tuple[str, ...]:
        """The hyperparameters a caller must give (a sweep's grid included)."""
        return tuple(h for h in self.hyper if h not in self.optional)

    @property
    def grid_axes(self) -> tuple[str, ...]:
        """A sweep's grid axes, in C order: ``lr`` (its ``eta`` on the sphere), the row's
        other hyperparameters, ``wd`` (0 without weight decay), then ``seed`` and
        ``init_norm``."""
        own = tuple(h for h in self.hyper if h not in ("lr", "eta", "wd"))
        return ("lr", *own, "wd", "seed", "init_norm")

    @property
    def reads(self) -> tuple[str, ...]:
        """Every ``RunOptions`` field it reads: its engine's, then its own."""
        return ENGINES[self.engine].options + self.options


#: The engine's per-trajectory hyperparameters: each a (B,) array, read by the methods whose
#: ``hyper`` names it (the C++ ``Hyperparameters`` struct has one field per entry, in order).
#: Value: (meaning, lower bound) with bound "> 0" or ">= 0".
HYPERPARAMETERS: dict[str, tuple[str, str]] = {
    "lr": ("GD+WD's learning rate (pgd_adaptive: the run it follows)", "> 0"),
    "wd": ("weight decay, lr wd < 1", ">= 0"),
    "eta": ("effective LR on the sphere: pgd's, or the first", "> 0"),
    "c": ("Quasi-RMSprop's coefficient of ||g||^2", "> 0"),
}

#: What runs the rows, by ``MethodSpec.engine``.
ENGINES: dict[str, Engine] = {
    "trajectory": Engine(
        "trajectory", "dynamics.run_method", HYPERPARAMETERS,
        ("steps", "record_every", "sharpness_every", "theta_every", "jitter", "seed", "dtype",
         "backend", "eos_tol", "lanczos_tol", "lanczos_max_iter", "first_trajectory", "reduced",
         "top_k")),
    "minibatch": Engine(
        "minibatch", "sgd.run_minibatch",
        {"lr": ("learning rate", "> 0"), "batch": ("batch size B", ">= 1, whole"),
         "wd": ("weight decay, lr wd < 1", ">= 0")},
        ("steps", "record_every", "seed", "first_trajectory", "backend", "replacement",
         "max_loss"), core_only=True),
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
    MethodSpec("sgd", None, "SGD",
               "w+ = (1 - lr wd) w - lr (1/B) sum_{i in I_t} grad l_i(w), I_t a batch of B",
               "run_sgd", hyper=("lr", "batch", "wd"), optional=("wd",), numba=False,
               sweep=True, engine="minibatch"),
)

#: Every row of the table by name: the trajectory engine's in code order, then the others.
ALL_METHODS: dict[str, MethodSpec] = {
    m.name: m for m in sorted(_ROWS, key=lambda m: (m.code is None, m.code or 0))}

#: The trajectory engine's rows by name, in code order: the C++ ``enum class Method``
#: (``tools/gen_methods.py``), ``pysharp._engine.Method`` and ``pysharp._core.METHODS``.
METHODS: dict[str, MethodSpec] = {
    name: m for name, m in ALL_METHODS.items() if m.engine == "trajectory"}


def method_spec(name: str, engine: str | None = None) -> MethodSpec:
    """The row of the method called ``name``; a ValueError naming the choices otherwise.

    With ``engine``, a row another engine runs is refused too, naming its function.
    """
    try:
        spec = ALL_METHODS[name]
    except (KeyError, TypeError):
        choices = list(ALL_METHODS if engine is None else
                       (n for n, m in ALL_METHODS.items() if m.engine == engine))
        raise ValueError(f"unknown method {name!r}; choose one of {choices}") from None
    if engine is not None and spec.engine != engine:
        raise ValueError(f"method {name!r} is not run by the {engine} engine: use "
                         f"pysharp.{spec.runner}")
    return spec
