"""The traced program: ``jax.value_and_grad(loss)``'s jaxpr flattened into equations.

Calls (jit/pjit, closed_call, custom_jvp_call, custom_vjp_call, remat) are inlined, each
equation keeps the user's source line, and every value knows whether it depends on w or on
the data. The walk of the primal loss for the equations that can part a model from JAX
(:func:`_suspects`) lives here too.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
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
    """One equation: a JAX equation, or one the walk wrote itself (``fold`` then evaluates
    it on data: the slices and stacks of an unrolled scan)."""

    prim: str
    ins: list
    outs: list
    params: dict
    where: str
    jax_eqn: Any = None
    fold: Callable | None = None

    def evaluate(self, *args) -> list:
        """The outputs' values for the inputs' values ``args`` (data: JAX evaluates them)."""
        if self.fold is not None:
            res = self.fold(*args)
            return list(res) if len(self.outs) > 1 else [res]
        je = self.jax_eqn
        bind = je.primitive.get_bind_params(je.params)
        subfuns, params = ((), bind) if isinstance(bind, dict) else bind
        res = je.primitive.bind(*subfuns, *args, **params)
        return list(res) if je.primitive.multiple_results else [res]


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
    """The jaxpr of value_and_grad(loss) flattened into equations on _Val: calls inlined,
    scans (``lax.scan``, ``fori_loop`` with static bounds) unrolled, sorts by data keys
    split into the data's sort and a gather of the values that depend on w."""

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
            elif eqn.primitive.name == "scan":
                outs = self._unroll(eqn.params, ins, where)
            elif eqn.primitive.name == "sort" and any(x.wdep for x in ins) and not any(
                    x.wdep for x in ins[:int(eqn.params["num_keys"])]):
                outs = self._sort_by_data(eqn.params, ins, where)
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

    def _unroll(self, params: dict, ins: list, where: str) -> list:
        """A scan as ``length`` copies of its body in order (reversed for a reverse scan):
        x_t = xs[t] and ys = stack(y_t) as equations of their own."""
        n, nc, ncar = int(params["length"]), int(params["num_consts"]), int(params["num_carry"])
        consts, carry, xs = ins[:nc], list(ins[nc:nc + ncar]), ins[nc + ncar:]
        steps: dict[int, list] = {}
        for t in (range(n - 1, -1, -1) if params["reverse"] else range(n)):
            x_t = [self._synthetic("slice", {"start_indices": (t,) + (0,) * (len(x.shape) - 1),
                                             "strides": None}, [x], [(1, *x.shape[1:])],
                                   lambda a, t=t: a[t:t + 1], where)[0] for x in xs]
            x_t = [self._synthetic("reshape", {}, [x], [x.shape[1:]],
                                   lambda a, s=x.shape[1:]: a.reshape(s), where)[0]
                   for x in x_t]
            out = self._flatten(params["jaxpr"], [*consts, *carry, *x_t], where)
            carry, steps[t] = out[:ncar], out[ncar:]
        ys = []
        body = getattr(params["jaxpr"], "jaxpr", params["jaxpr"])
        for j, var in enumerate(body.outvars[ncar:]):
            shape, dtype = tuple(var.aval.shape), np.dtype(var.aval.dtype)
            if n == 0:
                ys.append(self._const(np.zeros((0, *shape), dtype)))
                continue
            rows = [self._synthetic("reshape", {}, [steps[t][j]], [(1, *shape)],
                                    lambda a, s=(1, *shape): a.reshape(s), where)[0]
                    for t in range(n)]
            ys.append(rows[0] if n == 1 else self._synthetic(
                "concatenate", {"dimension": 0}, rows, [(n, *shape)],
                lambda *a: np.concatenate([np.asarray(r) for r in a]), where)[0])
        return [*carry, *ys]

    def _sort_by_data(self, params: dict, ins: list, where: str) -> list:
        """A sort whose keys are data (``lax.sort_key_val(t, z)``): the data operands and
        the order (a sorted iota) are one sort of the data, which JAX evaluates; each
        operand that depends on w is gathered in that order (a ``sort`` of params
        ``order=True``: operand and order)."""
        dim, keys = int(params["dimension"]), int(params["num_keys"])
        shape = ins[0].shape
        data = [x for x in ins if not x.wdep]
        iota = self._const(np.broadcast_to(np.arange(shape[dim], dtype=np.int32).reshape(
            [-1 if d == dim else 1 for d in range(len(shape))]), shape).copy())
        sorted_data = self._synthetic(
            "sort", dict(params), [*data, iota], [shape] * (len(data) + 1),
            lambda *a: _sort(a, dim, bool(params["is_stable"]), keys), where,
            [x.dtype for x in data] + [np.dtype(np.int32)])
        order, it = sorted_data[-1], iter(sorted_data[:-1])
        return [next(it) if not x.wdep else self._synthetic(
            "sort", {"dimension": dim, "order": True}, [x, order], [shape],
            lambda a, p: np.take_along_axis(np.asarray(a), np.asarray(p), dim), where)[0]
            for x in ins]

    def _synthetic(self, prim: str, params: dict, ins: list, shapes: list, fold: Callable,
                   where: str, dtypes: list | None = None) -> list:
        """An equation of the walk's own (its translator reads ``params``; ``fold``
        evaluates it on data) and its outputs, of ``shapes`` and ``dtypes`` (ins[0]'s)."""
        e = _Eqn(prim, ins, [], params, where, fold=fold)
        for shape, dtype in zip(shapes, dtypes or [ins[0].dtype] * len(shapes)):
            e.outs.append(_Val(tuple(int(s) for s in shape), dtype,
                               wdep=any(x.wdep for x in ins),
                               datadep=any(x.datadep for x in ins), producer=e))
        self.eqns.append(e)
        return e.outs


def _sort(arrays, dimension: int, is_stable: bool, num_keys: int) -> list:
    """lax.sort of data arrays, as the traced sort would (JAX's order, NaNs and ties)."""
    from jax import lax
    return lax.sort(list(arrays), dimension=dimension, is_stable=is_stable, num_keys=num_keys)


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
