"""``RunOptions``: the options of one engine run, carried whole from a public function down.

The public functions (``run_gd_wd``, ``run_pgd``, ``run_scalar_rmsprop``, ``run_sgd``) keep
their keyword arguments; each builds one ``RunOptions`` from them and hands it to its
engine's runner (``pysharp.dynamics.run_method``, ``pysharp.sgd.run_minibatch``), as does a
sweep's chunk (``Settings.run_options``). The runner validates the values and fills the
defaults left as None; which fields a method reads is its row's ``reads``
(``pysharp._engine.methods``), and a runner refuses a field set that its method does not read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .methods import MethodSpec


@dataclass(frozen=True)
class RunOptions:
    """Everything a run takes besides the model, the starts and the hyperparameters.

    A field's meaning is that of the public function's keyword of the same name
    (:func:`pysharp.run_gd_wd`, :func:`pysharp.run_sgd`); values are checked by the
    runner, not here. None means the engine's default (``record_every``: steps // 1000
    for the trajectory engine, steps // 100 for SGD).

    Attributes
    ----------
    steps : int
        Number of updates.
    record_every, sharpness_every, theta_every : int or None
        Record, sharpness and snapshot intervals in steps (the trajectory engine's).
    jitter : float
        Per-step noise sigma >= 0 (trajectory engine).
    seed : int
        Key of the random streams (jitter and Lanczos starts; SGD's batches).
    dtype : float32, float64 or None
        Precision of a trajectory run (None: that of ``w0``).
    backend : str
        Which engine runs it (see :func:`pysharp.backends`).
    eos_tol : float
        Relative tolerance of the Edge of Stability labels.
    lanczos_tol : float
        Relative residual tolerance of the in-run sharpness.
    lanczos_max_iter : int or None
        Its Krylov dimension cap (None: min(D, 128)).
    first_trajectory : int
        Global index of the first trajectory (keys the random streams).
    reduced : bool or None
        BN linear regression's reduced update (None: whenever possible).
    rms_beta, rms_eps, qr_kappa : float
        Scalar RMSprop's and Quasi-RMSprop's constants (the rows whose ``options`` name them).
    top_k : int
        Top eigenvalues recorded at sharpness steps (1: the sharpness alone).
    replacement : bool
        SGD: draw batches with replacement.
    max_loss : float
        SGD: a recorded loss above this flags divergence.
    """

    steps: int
    record_every: int | None = None
    sharpness_every: int | None = None
    theta_every: int = 0
    jitter: float = 0.0
    seed: int = 0
    dtype: Any = None
    backend: str = "auto"
    eos_tol: float = 0.05
    lanczos_tol: float = 1e-10
    lanczos_max_iter: int | None = None
    first_trajectory: int = 0
    reduced: bool | None = None
    rms_beta: float = 0.99
    rms_eps: float = 1e-12
    qr_kappa: float = 0.0
    top_k: int = 1
    replacement: bool = False
    max_loss: float = 1e100

    def check_read_by(self, spec: MethodSpec) -> None:
        """Refuse a field set away from its default that ``spec``'s method does not read.

        Raises
        ------
        ValueError
            Naming those fields and the method.
        """
        unread = [f.name for f in fields(self)
                  if f.name not in spec.reads and getattr(self, f.name) != f.default]
        if unread:
            raise ValueError(f"method {spec.name!r} does not read {', '.join(unread)} "
                             f"(it reads {', '.join(spec.reads)})")
