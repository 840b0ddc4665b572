"""The traced program: ``jax.value_and_grad(loss)``'s jaxpr flattened into equations.

Calls (jit/pjit, closed_call, custom_jvp_call, custom_vjp_call, remat) are inlined, each
equation keeps the user's source line, and every value knows whether it depends on w or on
the data. The walk of the primal loss for the equations that can part a model from JAX
(:func:`_suspects`) lives here too.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._check import _jax_x64

#: Calls whose inner jaxpr is inlined.
_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "custom_vjp_call_jaxpr", "remat", "checkpoint", "remat2")


@dataclass(eq=False)
class _Val:
    shape: tuple
    dtype: np.dtype
    wdep: bool = False          # depends on w
    datadep: bool = False       # depends on the data
    const: Any = None           # literal / closed-over constant (numpy)
    input_name: str | None = None
    producer: _Eqn | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(eq=False)
class _Eqn:
    prim: str
    ins: list
    outs: list
    params: dict
    where: str
    jax_eqn: Any


def _where(eqn) -> str:
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - a JAX without the helper: no line
        return "unknown line"


def _inner_jaxpr(eqn):
    if eqn.primitive.name not in _CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if inner is None:
            continue
        jaxpr = getattr(inner, "jaxpr", inner)
        if hasattr(jaxpr, "eqns") and len(jaxpr.invars) == len(eqn.invars):
            return inner
    return None


class _Program:
    """The jaxpr of value_and_grad(loss) flattened into equations on _Val."""

    def __init__(self, closed, w_val: _Val, data_vals: list) -> None:
        from jax._src import core as jcore
        self.jcore = jcore
        self.eqns: list[_Eqn] = []
        self.outs = self._flatten(closed, [w_val, *data_vals])

    def _const(self, value) -> _Val:
        a = np.asarray(value)
        return _Val(tuple(a.shape), a.dtype, const=a)

    def _flatten(self, closed, in_vals, outer: str = ""):
        jcore = self.jcore
        jaxpr = getattr(closed, "jaxpr", closed)
        consts = getattr(closed, "consts", ())
        env = {}
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = self._const(c)
        for v, x in zip(jaxpr.invars, in_vals):
            env[v] = x

        def read(a):
            if isinstance(a, jcore.Literal):
                return self._const(a.val)
            return env[a]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            inner = _inner_jaxpr(eqn)
            where = _where(eqn)
            if ":" not in where:  # inside JAX's own functions: the line that called them
                where = outer or "an unknown line"
            if inner is not None:
                outs = self._flatten(inner, ins, where)
            else:
                outs = []
                e = _Eqn(eqn.primitive.name, ins, outs, dict(eqn.params), where, eqn)
                for ov in eqn.outvars:
                    aval = ov.aval
                    outs.append(_Val(tuple(aval.shape), np.dtype(aval.dtype),
                                     wdep=any(x.wdep for x in ins),
                                     datadep=any(x.datadep for x in ins), producer=e))
                self.eqns.append(e)
            for ov, o in zip(eqn.outvars, outs):
                if not isinstance(ov, jcore.DropVar):
                    env[ov] = o
        return [read(a) for a in jaxpr.outvars]


def _static(v) -> bool:
    return isinstance(v, (bool, int, np.integer)) and not isinstance(v, np.ndarray)


def _as_jax(jnp, v):
    a = np.asarray(v)
    if a.dtype.kind == "f" or isinstance(v, numbers.Real) and a.dtype.kind == "f":
        return jnp.asarray(a, dtype=jnp.float64)
    if a.dtype.kind in "biu":
        return jnp.asarray(a)
    raise TypeError(f"data must be real arrays or numbers, got dtype {a.dtype}")


#: Equations whose derivatives the model and JAX can take differently: JAX rounds where the
#: model (float64 throughout) does not; JAX differentiates a custom rule where the model
#: differentiates the rule's equations as traced.
_NARROW = ("float32", "float16", "bfloat16")


def _suspects(loss, w, data: dict) -> list[str]:
    """Where the model can part from JAX in the primal loss's jaxpr: custom_jvp/custom_vjp
    calls and casts below float64 on values that depend on w, in program order, with the
    user's lines (an empty list when the loss cannot be traced again)."""
    import jax
    import jax.numpy as jnp
    from jax._src import core as jcore

    found: list[str] = []

    def walk(jaxpr, wdep_in, outer=""):
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        dep = {v for v, d in zip(jaxpr.invars, wdep_in) if d}
        for eqn in jaxpr.eqns:
            ins = [not isinstance(a, jcore.Literal) and a in dep for a in eqn.invars]
            where = _where(eqn)
            where = where if ":" in where else (outer or "an unknown line")
            name = eqn.primitive.name
            if any(ins):
                if name.startswith(("custom_jvp", "custom_vjp")):
                    kind = "custom_jvp" if "jvp" in name else "custom_vjp"
                    found.append(f"a {kind} function at {where}: its rule, not its "
                                 "equations, gives the derivatives, and the model takes them "
                                 "from the rule's equations as traced")
                elif name in ("convert_element_type", "reduce_precision") and \
                        str(eqn.outvars[0].aval.dtype) in _NARROW:
                    found.append(f"{name} to {eqn.outvars[0].aval.dtype} at {where}: JAX rounds "
                                 "there, the model computes in float64 (keep the loss in float64)")
                sub = _inner_jaxpr(eqn)
                if sub is not None:
                    walk(sub, ins, where)
                dep.update(o for o in eqn.outvars if not isinstance(o, jcore.DropVar))
        return found

    try:
        arrays = {k: v for k, v in data.items() if not _static(v)}
        static = {k: v for k, v in data.items() if _static(v)}
        with _jax_x64(jax):
            closed = jax.make_jaxpr(lambda x, a: loss(x.reshape(w.shape), **a, **static))(
                jnp.asarray(w.reshape(-1), dtype=jnp.float64),
                {k: _as_jax(jnp, v) for k, v in arrays.items()})
        names = sorted(arrays)
        return walk(closed, [True] + [False] * len(names))
    except Exception:  # noqa: BLE001 - a diagnosis only: the check's report stands alone
        return found
