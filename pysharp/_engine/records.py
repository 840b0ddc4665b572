"""What a trajectory run returns, one row per array: the single list every engine reads.

The compiled engine's side is generated from this table: ``tools/gen_methods.py`` writes it as
the X-macro ``PYSHARP_RECORDS`` (csrc/include/pysharp/engine/records.hpp; CI checks it is
current), from which ``BatchRecords`` and ``TrajectoryRecords`` (engine/trajectory.hpp) take
their fields in this order and csrc/bind_model.hpp's ``RunOutputs`` its arrays, names, shapes
and which records a result holds; ``pysharp._core.RECORDS`` is the table the core was compiled
with. The CuPy launcher allocates the arrays and lays out ``BatchRecords`` from here
(``_backends._cupy``), the XLA engine (``_backends._jax``) and the Numba port return them,
and :func:`pysharp.dynamics.run_method` turns them into a ``Trajectory``.
tests/engine/test_records.py checks the core's table against this one row by row and its
result against :func:`run_outputs` key by key.

Adding a record: a row here, ``python tools/gen_methods.py``, and the line in
``TrajectoryRunner::observe`` (engine/trajectory.hpp) that writes it; then, for the Python
engines, its line in each of them, and its attribute of ``Trajectory``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike


@dataclass(frozen=True)
class Record:
    """One array of a run's result.

    Attributes
    ----------
    name : str
        Its key in the result dict and its attribute of ``Trajectory``.
    field : str
        Its field of the C++ ``BatchRecords``.
    every : str
        Its leading axis: "record" (steps 0, record_every, ...), "sharpness" (the
        sharpness steps), "theta" (the snapshot steps) or "" (none: one per trajectory).
    item : str
        Its trailing axes per trajectory: "" (a scalar), "D" (a point), "G" (one value per
        parameter group), "k" (the top-k eigenvalues).
    dtype : str
        "real" (the run's precision), "u8" (a flag) or "i64" (a step).
    when : str
        When it is computed: "" always, "sharpness" when sharpness is tracked (else it has
        zero rows), "groups" for a model of several groups, "top_k" for top_k >= 2; the last
        two are absent from the result otherwise.
    """

    name: str
    field: str
    every: str
    item: str = ""
    dtype: str = "real"
    when: str = ""


#: Every array of a run's result, in ``BatchRecords``' order.
RECORDS: tuple[Record, ...] = (
    Record("loss", "loss", "record"),
    Record("norm2", "norm2", "record"),
    Record("eff_lr", "eff_lr", "record"),
    Record("grad_norm", "grad_norm", "record"),
    Record("top_grad", "top_grad", "record", when="sharpness"),
    Record("sharpness", "sharpness", "sharpness"),
    Record("eos_ratio", "eos_ratio", "sharpness"),
    Record("sharpness_converged", "sharpness_converged", "sharpness", dtype="u8"),
    Record("theta", "theta", "theta", item="D"),
    Record("w", "w_final", "", item="D"),
    Record("diverged", "diverged", "", dtype="u8"),
    Record("diverged_step", "diverged_step", "", dtype="i64"),
    Record("group_norm2", "group_norm2", "record", item="G", when="groups"),
    Record("top_eigenvalues", "top_eigs", "sharpness", item="k", when="top_k"),
)

#: The rows by name.
BY_NAME: dict[str, Record] = {r.name: r for r in RECORDS}


def n_records(steps: int, every: int) -> int:
    """Records at steps 0, every, 2 every, ... <= steps; 0 for every = 0 (trajectory.hpp)."""
    return steps // every + 1 if every > 0 else 0


def run_outputs(B: int, D: int, groups: int, *, steps: int, record_every: int,
                sharpness_every: int, theta_every: int, top_k: int,
                real: DTypeLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of every array a run fills, in :data:`RECORDS` order; an
    output not asked for has a zero-size shape (so the compiled modules can allocate
    them all)."""
    k = top_k if top_k >= 2 else 0
    rows = {"record": n_records(steps, record_every),
            "sharpness": n_records(steps, sharpness_every),
            "theta": n_records(steps, theta_every)}
    on = {"": True, "sharpness": sharpness_every > 0, "groups": groups > 1, "top_k": k > 0}
    items = {"": (), "D": (D,), "G": (groups,), "k": (k or 1,)}
    dtypes = {"real": np.dtype(real), "u8": np.dtype(np.uint8), "i64": np.dtype(np.int64)}
    out = {}
    for r in RECORDS:
        lead = (rows[r.every] if on[r.when] else 0,) if r.every else ()
        out[r.name] = (lead + (B,) + items[r.item], dtypes[r.dtype])
    return out


def run_result_names(groups: int, top_k: int) -> list[str]:
    """The keys of a run's result: every record, then ``group_norm2`` for a model of several
    groups and ``top_eigenvalues`` for top_k >= 2 (whether or not sharpness is tracked)."""
    on = {"": True, "sharpness": True, "groups": groups > 1, "top_k": top_k >= 2}
    return [r.name for r in RECORDS if on[r.when]]


def drop_batch_axis(result: dict) -> dict:
    """The records of a one-trajectory run without their batch axis of length 1."""
    out = {}
    for name, a in result.items():
        r = BY_NAME.get(name)
        if r is None or a is None:
            out[name] = a
        else:
            out[name] = a[:, 0] if r.every else a[0]
    return out
