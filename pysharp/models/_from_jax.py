"""``pysharp.models.from_jax``: a loss written in JAX, traced into a compiled model.

JAX differentiates: ``jax.value_and_grad(loss)`` is traced to a jaxpr (under
float64), and every equation of it that depends on ``w`` becomes one statement
of a generated model header of the documented form (``pysharp/model.hpp``),
templated on the scalar type ``S`` like every model, so the engine's jets give
the exact Hessian-vector product and D^3L[v, v] of the traced gradient.
Equations that depend on the data only are evaluated by JAX when the model is
built and bound as fields of the model (``c_*``), so the header depends on the
function and the shapes alone: new data of the same shapes reuses the
compiled module.

The header is written to ``<cache>/jax/<Name>_<hash of its text>.hpp`` and
loaded with :func:`pysharp.models.load_model`; ``model.source`` is its text.
"""

from __future__ import annotations

import contextlib
import hashlib
import keyword
import math
import numbers
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ._check import _jax_x64
from ._check import check as run_check
from ._compiler import cache_dir, write_private
from ._groups import equal_blocks, group_bounds
from ._loaded import LoadedModel, _dtype_name, check_real_data, fields_from_files

#: Primitives translated on values that depend on w (data-only equations may use any
#: primitive: JAX evaluates them). Calls (jit/pjit, closed_call, custom_jvp_call,
#: custom_vjp_call, remat) are inlined.
SUPPORTED = (
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "square", "integer_pow", "pow",
    "sqrt", "rsqrt", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos",
    "abs", "sign",
    "select_n", "clamp", "gt", "lt", "ge", "le", "eq", "ne", "and", "or", "not",
    "dot_general", "reduce_sum", "reduce_max", "reduce_min", "broadcast_in_dim", "reshape",
    "transpose", "squeeze", "expand_dims", "concatenate", "slice", "pad", "split",
    "convert_element_type", "copy", "copy_p", "stop_gradient", "reduce_precision",
    "optimization_barrier", "is_finite", "stack", "unstack", "rev", "gather", "scatter-add",
    "dynamic_slice", "dynamic_update_slice",
)
_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "custom_vjp_call_jaxpr", "remat", "checkpoint", "remat2")
_ALIASES = ("reshape", "squeeze", "expand_dims", "copy", "copy_p", "reduce_precision",
            "optimization_barrier")
_RESERVED = {"w", "loss", "g", "work", "S", "Real", "dim", "work_size", "loss_grad", "n_groups",
             "group_begin",
             "value_of", "select", "sqrt_", "exp_", "expm1_", "log_", "log1p_", "tanh_", "sin_",
             "cos_", "matvec_rows",
             "matvec_cols", "mask_t", "pysharp"}


class UnsupportedPrimitive(ValueError):
    """A primitive of the traced loss that from_jax cannot translate (message: which, where,
    and the way forward)."""


#: The way forward common to every refusal: the loss runs as it is, untraced.
_UNTRACED = "run it untraced in XLA: from_jax(..., compile=False) (the default)"

#: A rewrite that compiles, by the primitive refused (or the family it belongs to).
_REWRITES = {
    "gather": "integer-label cross-entropy as one-hot targets, Y = jax.nn.one_hot(labels, k) "
              "passed as data: -jnp.mean(jnp.sum(jax.nn.log_softmax(z) * Y, axis=1)); an index "
              "computed from w has no derivative: compute it from the data",
    "scatter-add": "x.at[i].add(u) with data indices as x + one_hot(i, n).T @ u (a one-hot "
                   "matrix passed as data)",
    "sort": "a sort of w-dependent values: where the order is fixed by the data, sort the data "
            "(data-only computations may use any primitive) or pass the permutation as a "
            "one-hot matrix P (data) and write P @ z",
    "cumsum": "a cumulative sum is a product with a constant triangular matrix: "
              "jnp.tril(jnp.ones((n, n))) @ z",
    "cumlogsumexp": "jax.nn.logsumexp over masked copies: logsumexp(jnp.where(T, z, -jnp.inf), "
                    "axis=1) with T = jnp.tril(jnp.ones((n, n), bool))",
    "argmax": "the index of a maximum is piecewise constant: compute it from the data, or use "
              "jnp.max's value",
    "erf": "jax.nn.gelu(z, approximate=True) (the tanh form) compiles",
    "scan": "a loop with a static trip count: unroll it in Python (for t in range(n): ...), "
            "which traces to straight-line code",
    "while": "a while_loop has no static trip count; a fori_loop with static bounds can be "
             "unrolled in Python (for t in range(n): ...)",
    "cond": "both branches with jnp.where(pred, a, b) (they are evaluated, then chosen)",
    "conv_general_dilated": "a convolution of the data by w as a product: the data's patches "
                            "lax.conv_general_dilated_patches(X, ...) (data only) contracted "
                            "with the kernel by jnp.einsum; a convolution of w-dependent "
                            "activations has no rewrite",
    "reduce_prod": "jnp.prod(z) of positive z as jnp.exp(jnp.sum(jnp.log(z)))",
    "random_bits": "draw the random numbers outside the loss and pass them as data",
}
_REWRITES.update({k: _REWRITES["cumsum"] for k in ("cumprod", "cummax", "cummin")})
_REWRITES.update({k: _REWRITES["argmax"] for k in ("argmin",)})
_REWRITES.update({k: _REWRITES["erf"] for k in ("erfc", "erf_inv")})
_REWRITES.update({k: _REWRITES["scatter-add"] for k in ("scatter", "scatter_add", "scatter-mul",
                                                          "scatter_mul")})
_REWRITES.update({k: _REWRITES["random_bits"] for k in ("rng_bit_generator", "threefry2x32",
                                                         "random_wrap", "random_seed")})
_REWRITES["switch"] = _REWRITES["cond"]


def _refusal(prim: str, where: str, what: str | None = None,
             rewrite: str | None = None) -> UnsupportedPrimitive:
    """A refusal naming the primitive, the user's line and the way forward."""
    what = what or (f"primitive '{prim}' at {where} is not supported on values that depend "
                    "on w")
    rewrite = rewrite or _REWRITES.get(prim)
    forward = f"{_UNTRACED}" + (f"; or rewrite it to compile: {rewrite}" if rewrite else "")
    return UnsupportedPrimitive(
        f"from_jax: {what}. The way forward: {forward}. (Translated on values that depend on "
        f"w: {', '.join(SUPPORTED)}; data-only computations may use any primitive.)")


# -- the traced program, calls inlined ---------------------------------------------------------
@dataclass(eq=False)
class _Val:
    shape: tuple
    dtype: np.dtype
    wdep: bool = False          # depends on w
    datadep: bool = False       # depends on the data
    const: Any = None           # literal / closed-over constant (numpy)
    input_name: str | None = None
    producer: _Eqn | None = None
    uses: list = field(default_factory=list)  # indices of emitted eqns reading it

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


# -- C++ text helpers --------------------------------------------------------------------------
def _real_literal(x) -> str:
    x = float(x)
    if math.isnan(x):
        return "Real(NAN)"
    if math.isinf(x):
        return "Real(HUGE_VAL)" if x > 0 else "Real(-HUGE_VAL)"
    text = repr(x)
    return f"Real({text})"


#: The largest |n| a constant exponent ``x ** n.0`` is multiplied out for (n copies of x).
_MAX_INT_POWER = 64


def _integer_power(x: str, n: int) -> str:
    """x ** n (an integer) as a product: defined (with its derivatives) for every x, 0 too
    where n >= 0, as JAX's integer_pow is."""
    if n == 0:
        return "S(Real(1))"
    p = " * ".join([x] * abs(n))
    return p if n > 0 else f"Real(1) / ({p})"


def _constant_power(y: float | None) -> Callable[[str], str] | None:
    """x ** y as a function of x's expression for a constant y (a literal, or folded from
    literals: never data, so that the header does not depend on the data's values) whose
    power has derivatives wherever JAX's do, x <= 0 included (relu(z) ** 2.0 at its kink,
    r ** 2.0 at a negative r): an integer up to _MAX_INT_POWER, a product; +-0.5, a square
    root. None for any other y, which is exp(y log x)."""
    if y is None:
        return None
    if y.is_integer() and abs(y) <= _MAX_INT_POWER:
        return lambda x: _integer_power(x, int(y))
    if y == 0.5:
        return lambda x: f"sqrt_({x})"
    if y == -0.5:
        return lambda x: f"Real(1) / sqrt_({x})"
    return None


def _strides(shape) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _flat(idx: list[str], shape, strides=None) -> str:
    """The flat offset of multi-index ``idx`` (loop variables) into row-major ``shape``."""
    strides = _strides(shape) if strides is None else strides
    terms = []
    for i, n, s in zip(idx, shape, strides):
        if n == 1 or s == 0 or i == "0":
            continue
        terms.append(i if s == 1 else f"{i} * {s}")
    return " + ".join(terms) if terms else "0"


def _unravel(var: str, sizes, strides) -> str:
    """Offset sum_k digit_k(var) strides[k], digits of var in the mixed radix ``sizes``."""
    terms = []
    inner = 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != 0:
            digit = var if inner == 1 else f"({var} / {inner})"
            if inner * n != int(np.prod(sizes)):
                digit = f"({digit} % {n})"
            terms.append(digit if s == 1 else f"{digit} * {s}")
        inner *= n
    return " + ".join(reversed(terms)) if terms else "0"


def _window_offset(shape, smap, pre: str, window, window_pos, idx) -> str:
    """Gather's and scatter's flat offset into ``shape``: the start variable ``pre_k`` on
    axis ``smap[k]`` plus the window's index, axis ``window[j]`` read at
    ``idx[window_pos[j]]``."""
    strides, terms = _strides(shape), []
    for d, n in enumerate(shape):
        parts = [f"{pre}_{smap.index(d)}"] if d in smap else []
        if d in window and idx[window_pos[window.index(d)]] != "0":
            parts.append(idx[window_pos[window.index(d)]])
        if parts and n != 1:
            p = " + ".join(parts)
            terms.append(p if strides[d] == 1 else f"({p}) * {strides[d]}")
    return " + ".join(terms) or "0"


# -- storage of the values in the generated code ------------------------------------------------
class _Buffer:
    def __init__(self, size: int, first: int) -> None:
        self.size = size
        self.first = first
        self.last = first
        self.offset: int | None = None
        self.in_g = False
        self.token = ""


class _Ref:
    """How a value is read in the generated code."""

    def __init__(self, kind: str, name: str, *, is_s: bool, buffer: _Buffer | None = None,
                 offset: int = 0, is_int: bool = False) -> None:
        self.kind = kind  # "scalar" (one value, whatever the shape) or "array"
        self.name = name
        self.is_s = is_s
        self.buffer = buffer
        self.offset = offset
        self.is_int = is_int


class _Codegen:
    def __init__(self, prog: _Program, w_val: _Val, D: int, struct: str) -> None:
        self.prog = prog
        self.w_val = w_val
        self.D = D
        self.struct = struct
        self.refs: dict[int, _Ref] = {}
        self.lines: list[str] = []
        self.buffers: list[_Buffer] = []
        self.names: set[str] = set(_RESERVED)
        self.counter = 0
        self.fields: list[tuple] = []   # (name, val, kind, comment)
        self.constants: dict[int, float] = {}  # uniform constants inlined (not data), by id
        self.field_vals: dict[int, _Val] = {}
        self.step = 0

    # names
    def fresh(self, base: str) -> str:
        base = re.sub(r"\W", "_", base)
        self.counter += 1
        name = f"{base}_{self.counter}"
        while name in self.names:
            self.counter += 1
            name = f"{base}_{self.counter}"
        self.names.add(name)
        return name

    # reading values
    def ref(self, v: _Val) -> _Ref:
        return self.refs[id(v)]

    def at(self, v: _Val, idx) -> str:
        """Element ``idx`` of v: a flat index (v has the shape of the loop), or the loop's
        multi-index (a list), v broadcast to it along its axes of length 1."""
        r = self.ref(v)
        if not isinstance(idx, str):
            lead = len(idx) - len(v.shape)
            idx = _flat([i if n != 1 else "0" for i, n in zip(idx[lead:], v.shape)], v.shape)
        if r.kind == "scalar" or v.size == 1:
            return r.name if r.kind == "scalar" else f"{r.name}[{r.offset}]"
        i = idx if not r.offset else f"{r.offset} + {idx}"
        return f"{r.name}[{i}]"

    def s_at(self, v: _Val, idx: str) -> str:
        e = self.at(v, idx)
        return e if self.ref(v).is_s else f"S({e})"

    def v_at(self, v: _Val, idx: str) -> str:
        e = self.at(v, idx)
        return f"value_of({e})" if self.ref(v).is_s else e

    def is_scalar(self, v: _Val) -> bool:
        return self.ref(v).kind == "scalar" or v.size == 1

    def touch(self, v: _Val) -> None:
        r = self.refs.get(id(v))
        if r is not None and r.buffer is not None:
            r.buffer.last = max(r.buffer.last, self.last_use[id(v)])

    # defining values
    def new_array(self, v: _Val, base: str, comment_only=False) -> str:
        name = self.fresh(base)
        buf = _Buffer(v.size, self.step)
        buf.token = f"@BUF{len(self.buffers)}@"
        self.buffers.append(buf)
        self.refs[id(v)] = _Ref("array", name, is_s=True, buffer=buf)
        buf.last = max(buf.last, self.last_use[id(v)])
        self.lines.append(f"    S* const {name} = {buf.token};")
        return name

    def temp(self, size: int, base: str) -> str:
        name = self.fresh(base)
        buf = _Buffer(size, self.step)
        buf.token = f"@BUF{len(self.buffers)}@"
        self.buffers.append(buf)
        self.lines.append(f"    S* const {name} = {buf.token};")
        return name

    def new_scalar(self, v: _Val, base: str, expr: str, const=True) -> str:
        name = self.fresh(base)
        self.refs[id(v)] = _Ref("scalar", name, is_s=True)
        self.lines.append(f"    {'const ' if const else ''}S {name} = {expr};")
        return name

    def alias(self, out: _Val, src: _Val, offset: int = 0) -> None:
        r = self.ref(src)
        self.refs[id(out)] = _Ref(r.kind, r.name, is_s=r.is_s, buffer=r.buffer,
                                  offset=r.offset + offset, is_int=r.is_int)
        if r.buffer is not None:
            r.buffer.last = max(r.buffer.last, self.last_use[id(out)])

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def loop(self, shape, body: Callable[[list[str]], str], pre: str = "i") -> None:
        """Nested loops over ``shape`` around one statement ``body(index variables)``."""
        idx = []
        depth = 0
        for k, n in enumerate(shape):
            if n == 1:
                idx.append("0")
                continue
            var = f"{pre}{k}"
            idx.append(var)
            self.emit("  " * depth + f"for (int {var} = 0; {var} < {n}; ++{var})")
            depth += 1
        self.emit("  " * depth + body(idx))

    def elementwise(self, out: _Val, base: str, fn: Callable[[str], str]) -> None:
        """out = fn(flat index) over out's elements: one scalar when every operand is one."""
        ins = out.producer.ins
        if out.size == 1 or all(self.is_scalar(x) for x in ins):
            self.new_scalar(out, base, fn("0"))
            return
        name = self.new_array(out, base)
        if all(self.is_scalar(x) or x.shape == out.shape for x in ins):
            self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {fn('i')};")
        else:  # operands broadcast along their axes of length 1
            self.loop(out.shape, lambda idx: f"{name}[{_flat(idx, out.shape)}] = {fn(idx)};")

    # -- the program ----------------------------------------------------------------------------
    def plan(self) -> None:
        prog = self.prog
        loss_val, grad_val = prog.outs
        # Dead code: only equations the outputs need.
        needed: set[int] = {id(loss_val), id(grad_val)}
        keep = []
        for e in reversed(prog.eqns):
            if any(id(o) in needed for o in e.outs):
                keep.append(e)
                needed.update(id(x) for x in e.ins)
        keep.reverse()
        self.fold = [e for e in keep if not any(x.wdep for x in e.ins)]
        self.code = [e for e in keep if any(x.wdep for x in e.ins)]
        bad = [e for e in self.code if e.prim not in SUPPORTED]
        if bad:
            e = bad[0]
            raise _refusal(e.prim, e.where)
        self.last_use: dict[int, int] = {}
        for k, e in enumerate(self.code):
            for x in e.ins:
                self.last_use[id(x)] = k
            for o in e.outs:
                self.last_use.setdefault(id(o), k)
        end = len(self.code)
        self.last_use[id(loss_val)] = end
        self.last_use[id(grad_val)] = end
        # The frontier: data-only values the code reads.
        frontier: list[_Val] = []
        seen: set[int] = set()
        for x in [i for e in self.code for i in e.ins] + [loss_val, grad_val]:
            if not x.wdep and id(x) not in seen:
                seen.add(id(x))
                frontier.append(x)
        self.frontier = frontier

    def bind_constants(self, values: dict[int, np.ndarray]) -> None:
        """Storage of the frontier values: uniform constants inline, the rest fields."""
        for x in self.frontier:
            if x.datadep or x.input_name is not None:
                self._field(x)
                continue
            a = np.asarray(values[id(x)])
            flat = a.reshape(-1)
            # uniform: NaN too (jnp.var's ddof guard is an all-NaN array, NaN != NaN)
            if flat.size and a.dtype.kind in "fiub" and np.all(
                    (flat == flat[0]) | (np.isnan(flat) & np.isnan(flat[0]))
                    if a.dtype.kind == "f" else flat == flat[0]):
                lit = _real_literal(flat[0])
                self.refs[id(x)] = _Ref("scalar", lit, is_s=False)
                self.constants[id(x)] = float(flat[0])
            else:
                self._field(x)

    def _field(self, x: _Val) -> None:
        if x.input_name is not None:
            base = x.input_name
            name = base if base.isidentifier() and base not in self.names and \
                not keyword.iskeyword(base) else self.fresh("data")
            self.names.add(name)
        else:
            base = "c_" + (x.producer.prim if x.producer is not None else "const")
            name = self.fresh(base)
        is_int = x.dtype.kind in "biu"
        kind = "scalar" if x.shape == () else "array"
        self.refs[id(x)] = _Ref(kind, name, is_s=False, is_int=is_int)
        self.fields.append((name, x, kind, is_int))
        self.field_vals[id(x)] = x

    def generate(self) -> None:
        for k, e in enumerate(self.code):
            self.step = k
            where = e.where.replace("\n", " ")
            shapes = ", ".join(f"{o.dtype.name}{list(o.shape)}" for o in e.outs)
            self.lines.append(f"    // {e.prim} -> {shapes}   [{where}]")
            getattr(self, "_p_" + e.prim.replace("-", "_"), self._p_elementwise)(e)
        self.place_grad()
        loss_val, grad_val = self.prog.outs
        self.step = len(self.code)
        self.lines.append("    // outputs")
        self.lines.append(f"    *loss = {self.s_at(loss_val, '0')};")
        r = self.ref(grad_val)
        if not (r.buffer is not None and r.buffer.in_g):
            self.emit(f"for (int i = 0; i < {self.D}; ++i) g[i] = {self.s_at(grad_val, 'i')};")

    def place_grad(self) -> None:
        """The gradient's buffer, when it is a whole buffer of D values, is g itself."""
        grad_val = self.prog.outs[1]
        r = self.refs.get(id(grad_val))
        if r is not None and r.buffer is not None and r.offset == 0 and \
                r.buffer.size == self.D and r.kind == "array":
            r.buffer.in_g = True

    def allocate(self) -> int:
        """Offsets in work: a buffer is reused once every reader is done (first fit)."""
        free: list[list[int]] = []  # [offset, size]
        live: list[_Buffer] = []
        top = 0
        for buf in sorted(self.buffers, key=lambda b: b.first):
            if buf.in_g:
                continue
            for b in [b for b in live if b.last < buf.first]:
                live.remove(b)
                free.append([b.offset, b.size])
            free.sort()
            merged: list[list[int]] = []
            for blk in free:
                if merged and merged[-1][0] + merged[-1][1] == blk[0]:
                    merged[-1][1] += blk[1]
                else:
                    merged.append(blk)
            free = merged
            for blk in free:
                if blk[1] >= buf.size:
                    buf.offset = blk[0]
                    blk[0] += buf.size
                    blk[1] -= buf.size
                    break
            else:
                buf.offset = top
                top += buf.size
            free = [b for b in free if b[1] > 0]
            live.append(buf)
        return top

    # -- primitives -----------------------------------------------------------------------------
    def _p_elementwise(self, e: _Eqn) -> None:  # pragma: no cover - SUPPORTED lists them all
        raise _refusal(e.prim, e.where)

    def _binary(self, e, op):
        a, b = e.ins
        self.elementwise(e.outs[0], e.prim, lambda i: f"{self.at(a, i)} {op} {self.at(b, i)}")

    def _p_add(self, e):
        self._binary(e, "+")

    _p_add_any = _p_add

    def _p_sub(self, e):
        self._binary(e, "-")

    def _p_mul(self, e):
        self._binary(e, "*")

    def _p_div(self, e):
        self._binary(e, "/")

    def _unary(self, e, fn):
        (a,) = e.ins
        self.elementwise(e.outs[0], e.prim, lambda i: fn(self.s_at(a, i)))

    def _p_neg(self, e):
        self._unary(e, lambda x: f"-{x}")

    def _p_square(self, e):
        self._unary(e, lambda x: f"{x} * {x}")

    def _p_integer_pow(self, e):
        y = int(e.params["y"])
        self._unary(e, lambda x: _integer_power(x, y))

    def _p_pow(self, e):
        a, b = e.ins
        power = _constant_power(self.constants.get(id(b)))
        if power is None:  # exp(y log x): its derivatives need x > 0, as JAX's do
            self.elementwise(e.outs[0], "pow_",
                             lambda i: f"exp_({self.at(b, i)} * log_({self.s_at(a, i)}))")
        else:
            self.elementwise(e.outs[0], "pow_", lambda i: power(self.s_at(a, i)))

    def _p_sqrt(self, e):
        self._unary(e, lambda x: f"sqrt_({x})")

    def _p_rsqrt(self, e):
        self._unary(e, lambda x: f"Real(1) / sqrt_({x})")

    def _p_exp(self, e):
        self._unary(e, lambda x: f"exp_({x})")

    def _p_exp2(self, e):
        self._unary(e, lambda x: f"exp_(Real(0.6931471805599453) * {x})")

    def _p_log(self, e):
        self._unary(e, lambda x: f"log_({x})")

    def _p_log1p(self, e):
        self._unary(e, lambda x: f"log1p_({x})")

    def _p_expm1(self, e):
        self._unary(e, lambda x: f"expm1_({x})")

    def _p_tanh(self, e):
        self._unary(e, lambda x: f"tanh_({x})")

    def _p_sin(self, e):
        self._unary(e, lambda x: f"sin_({x})")

    def _p_cos(self, e):
        self._unary(e, lambda x: f"cos_({x})")

    def _p_logistic(self, e):
        self._unary(e, lambda x: f"Real(1) / (Real(1) + exp_(-{x}))")

    def _p_abs(self, e):
        (a,) = e.ins
        self.elementwise(e.outs[0], "abs", lambda i: (
            f"select({self.v_at(a, i)} >= Real(0), {self.s_at(a, i)}, -{self.s_at(a, i)})"))

    def _p_sign(self, e):
        (a,) = e.ins
        self.elementwise(e.outs[0], "sign", lambda i: (
            f"select({self.v_at(a, i)} > Real(0), S(Real(1)), select({self.v_at(a, i)} < "
            f"Real(0), S(Real(-1)), S(Real(0))))"))

    def _p_stop_gradient(self, e):
        (a,) = e.ins
        self.elementwise(e.outs[0], "stop_gradient", lambda i: f"S({self.v_at(a, i)})")

    def _p_max(self, e):
        a, b = e.ins
        self.elementwise(e.outs[0], e.prim, lambda i: (
            f"select({self.v_at(a, i)} > {self.v_at(b, i)}, {self.s_at(a, i)}, "
            f"{self.s_at(b, i)})"))

    def _p_min(self, e):
        a, b = e.ins
        self.elementwise(e.outs[0], e.prim, lambda i: (
            f"select({self.v_at(a, i)} < {self.v_at(b, i)}, {self.s_at(a, i)}, "
            f"{self.s_at(b, i)})"))

    def _p_clamp(self, e):
        lo, x, hi = e.ins

        def fn(i):
            inner = (f"select({self.v_at(x, i)} < {self.v_at(hi, i)}, {self.s_at(x, i)}, "
                     f"{self.s_at(hi, i)})")
            return (f"select({self.v_at(lo, i)} > value_of({inner}), {self.s_at(lo, i)}, "
                    f"{inner})")
        self.elementwise(e.outs[0], "clamp", fn)

    _CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "=="}

    def _compare(self, e):
        a, b = e.ins
        if a.dtype.kind != "f" or b.dtype.kind != "f":
            raise _refusal(e.prim, e.where, f"'{e.prim}' of non-float values depending on w "
                           f"at {e.where}", "compare float values, or compute the integers "
                           "from the data (data-only computations may use any primitive)")
        if e.prim == "ne":
            cond = lambda i: f"!({self.v_at(a, i)} == {self.v_at(b, i)})"  # noqa: E731
        else:
            op = self._CMP[e.prim]
            cond = lambda i: f"{self.v_at(a, i)} {op} {self.v_at(b, i)}"  # noqa: E731
        # A truth value is held as an S of value 1 or 0 (constant: no derivative).
        self.elementwise(e.outs[0], e.prim,
                         lambda i: f"select({cond(i)}, S(Real(1)), S(Real(0)))")

    _p_gt = _p_lt = _p_ge = _p_le = _p_eq = _p_ne = _compare

    def _p_is_finite(self, e):
        """A guard (jax.nn.logsumexp's): the value tested, a truth value held as 1 or 0."""
        (a,) = e.ins
        self.elementwise(e.outs[0], "is_finite", lambda i: (
            f"select(pysharp::is_finite({self.v_at(a, i)}), S(Real(1)), S(Real(0)))"))

    def _bool_only(self, e):
        if any(x.dtype != np.bool_ for x in e.ins):
            raise _refusal(e.prim, e.where, f"'{e.prim}' of integers depending on w at "
                           f"{e.where}", "combine float masks (a * b, a + b - a * b, 1 - a) "
                           "or compute the integers from the data")

    def _p_and(self, e):
        self._bool_only(e)
        a, b = e.ins
        self.elementwise(e.outs[0], "and_", lambda i: f"{self.s_at(a, i)} * {self.s_at(b, i)}")

    def _p_or(self, e):
        self._bool_only(e)
        a, b = e.ins
        self.elementwise(e.outs[0], "or_", lambda i: (
            f"{self.s_at(a, i)} + {self.s_at(b, i)} - {self.s_at(a, i)} * {self.s_at(b, i)}"))

    def _p_not(self, e):
        self._bool_only(e)
        (a,) = e.ins
        self.elementwise(e.outs[0], "not_", lambda i: f"Real(1) - {self.s_at(a, i)}")

    def _pred(self, p: _Val, i: str, k: int | None = None) -> str:
        """The truth value 'p selects case 1' (bool p) or 'p == k' (integer p)."""
        r = self.ref(p)
        if r.is_s:
            return f"value_of({self.at(p, i)}) > Real(0.5)"
        x = self.at(p, i)
        if k is None:
            return f"({x} != 0)"
        return f"({x} == {k})"

    def _p_select_n(self, e):
        p, *cases = e.ins
        r = self.ref(p)
        if r.is_s and p.dtype != np.bool_:
            raise _refusal(e.prim, e.where, f"an integer select_n predicate (lax.switch, "
                           f"jnp.select) computed from w at {e.where}",
                           "nested jnp.where(mask, a, b) on float comparisons")
        if r.kind == "scalar" and not r.is_s and not r.name.isidentifier():
            # A constant predicate (inlined literal): the case is known now.
            k = int(float(re.sub(r"Real\((.*)\)", r"\1", r.name)))
            self.alias(e.outs[0], cases[k]) if self.ref(cases[k]).is_s else \
                self.elementwise(e.outs[0], "select_n", lambda i: self.s_at(cases[k], i))
            return

        def fn(i):
            if len(cases) == 2 and p.dtype == np.bool_:
                return f"select({self._pred(p, i)}, {self.s_at(cases[1], i)}, " \
                       f"{self.s_at(cases[0], i)})"
            expr = self.s_at(cases[-1], i)
            for k in range(len(cases) - 2, -1, -1):
                expr = f"select({self._pred(p, i, k)}, {self.s_at(cases[k], i)}, {expr})"
            return expr
        self.elementwise(e.outs[0], "select_n", fn)

    def _p_convert_element_type(self, e):
        (a,) = e.ins
        out = e.outs[0]
        if out.dtype.kind != "f":
            raise _refusal(e.prim, e.where, f"convert_element_type of a value depending on w "
                           f"to {out.dtype} at {e.where} (only float <-> float and bool -> "
                           "float are differentiable)", "compute the integers from the data "
                           "(data-only computations may use any primitive)")
        self.alias(out, a)

    def _alias_op(self, e):
        self.alias(e.outs[0], e.ins[0])

    _p_reshape = _p_squeeze = _p_expand_dims = _p_copy = _p_copy_p = _alias_op
    _p_reduce_precision = _alias_op

    def _p_optimization_barrier(self, e):
        for o, x in zip(e.outs, e.ins):
            self.alias(o, x)

    def _copy_indexed(self, out: _Val, base: str, src_index: Callable[[list[str]], str],
                      src: _Val) -> None:
        if out.size == 1 or self.is_scalar(src):
            self.new_scalar(out, base, self.s_at(src, src_index(["0"] * len(out.shape))))
            return
        name = self.new_array(out, base)
        self.loop(out.shape, lambda idx: f"{name}[{_flat(idx, out.shape)}] = "
                                         f"{self.at(src, src_index(idx))};")

    def _p_broadcast_in_dim(self, e):
        (a,) = e.ins
        out = e.outs[0]
        if self.is_scalar(a) or a.size == out.size:  # nothing repeats: the same elements
            self.alias(out, a)
            return
        dims = tuple(e.params["broadcast_dimensions"])
        strides = _strides(a.shape)

        def src(idx):
            return _flat([idx[d] if a.shape[k] != 1 else "0" for k, d in enumerate(dims)],
                         a.shape, strides)
        self._copy_indexed(out, "broadcast", src, a)

    def _p_transpose(self, e):
        (a,) = e.ins
        perm = tuple(e.params["permutation"])
        strides = _strides(a.shape)
        moved = [p for p in perm if a.shape[p] != 1]
        if self.is_scalar(a) or moved == sorted(moved):
            self.alias(e.outs[0], a)  # only axes of length 1 move
            return

        def src(idx):
            return " + ".join(f"{idx[k]} * {strides[p]}" if strides[p] != 1 else idx[k]
                              for k, p in enumerate(perm) if idx[k] != "0") or "0"
        self._copy_indexed(e.outs[0], "transpose", src, a)

    def _slice(self, out: _Val, a: _Val, start, stride, base="slice"):
        strides = _strides(a.shape)
        offset = sum(s0 * st for s0, st in zip(start, strides))
        # Contiguous: axes of length 1 up to some axis p, whole axes after it, strides 1.
        contiguous = all(s == 1 for s in stride)
        p = next((k for k, n in enumerate(out.shape) if n != 1), len(out.shape))
        if any(out.shape[k] != a.shape[k] for k in range(p + 1, len(out.shape))):
            contiguous = False
        if contiguous and not self.is_scalar(a):
            if self.ref(a).kind == "array":
                self.alias(out, a, offset)
                return

        def src(idx):
            terms = [str(offset)] if offset else []
            for k, i in enumerate(idx):
                if i != "0":
                    m = stride[k] * strides[k]
                    terms.append(i if m == 1 else f"{i} * {m}")
            return " + ".join(terms) or "0"
        self._copy_indexed(out, base, src, a)

    def _p_slice(self, e):
        (a,) = e.ins
        start = tuple(e.params["start_indices"])
        stride = tuple(e.params["strides"] or (1,) * len(start))
        self._slice(e.outs[0], a, start, stride)

    def _p_split(self, e):
        (a,) = e.ins
        axis = int(e.params["axis"])
        pos = 0
        for out, size in zip(e.outs, e.params["sizes"]):
            start = [0] * len(a.shape)
            start[axis] = pos
            if id(out) in self.last_use:
                self._slice(out, a, start, (1,) * len(a.shape), "split")
            pos += int(size)

    def _p_concatenate(self, e):
        out = e.outs[0]
        dim = int(e.params["dimension"])
        if out.size == 1:
            (a,) = [x for x in e.ins if x.size == 1]
            self.new_scalar(out, "concatenate", self.s_at(a, "0"))
            return
        name = self.new_array(out, "concatenate")
        ostr = _strides(out.shape)
        pos = 0
        for x in e.ins:
            if x.size:
                base = pos * ostr[dim]
                self.loop(x.shape, lambda idx, x=x, base=base: (
                    f"{name}[{(str(base) + ' + ') if base else ''}{_flat(idx, x.shape, ostr)}]"
                    f" = {self.at(x, _flat(idx, x.shape))};"))
            pos += x.shape[dim]

    def _p_pad(self, e):
        """Padding in both directions: a negative pad drops elements (the gradient's
        transpose of a positive pad), interior padding spaces them."""
        a, value = e.ins
        out = e.outs[0]
        config = [tuple(int(c) for c in cfg) for cfg in e.params["padding_config"]]
        if all(lo <= 0 and hi <= 0 and it == 0 for lo, hi, it in config):
            self._slice(out, a, [-lo for lo, _, _ in config], (1,) * len(config), "pad")
            return
        name = self.new_array(out, "pad")
        self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {self.s_at(value, '0')};")
        ostr = _strides(out.shape)
        idx, depth, dst, ranges = [], 0, [], []
        const = sum(lo * s for (lo, _, _), s in zip(config, ostr))
        for n, (lo, _, it), m in zip(a.shape, config, out.shape):
            step = it + 1
            first = (-lo + step - 1) // step if lo < 0 else 0
            ranges.append((first, min(n, (m - 1 - lo) // step + 1), step))
        if any(stop <= first for first, stop, _ in ranges):
            return  # nothing of a lands in out
        for k, ((first, stop, step), m) in enumerate(zip(ranges, out.shape)):
            if stop - first == 1:
                var = str(first)
            else:
                var = f"p{k}"
                self.emit("  " * depth + f"for (int {var} = {first}; {var} < {stop}; ++{var})")
                depth += 1
            idx.append(var)
            if var != "0" and m != 1:
                dst.append(var if step * ostr[k] == 1 else f"{var} * {step * ostr[k]}")
        if const:
            dst.append(f"({const})")
        self.emit("  " * depth + f"{name}[{' + '.join(dst) or '0'}] = "
                  f"{self.s_at(a, _flat(idx, a.shape))};")

    def _p_rev(self, e):
        (a,) = e.ins
        dims = {int(d) for d in e.params["dimensions"]}
        astr = _strides(a.shape)
        self._copy_indexed(e.outs[0], "rev", lambda idx: _flat(
            [f"({a.shape[k] - 1} - {i})" if k in dims and i != "0" else i
             for k, i in enumerate(idx)], a.shape, astr), a)

    def _p_stack(self, e):
        out = e.outs[0]
        axis = int(e.params["axis"])
        if out.size == 1:
            self.new_scalar(out, "stack", self.s_at(e.ins[0], "0"))
            return
        name = self.new_array(out, "stack")
        ostr = _strides(out.shape)
        for k, x in enumerate(e.ins):
            self.loop(x.shape, lambda idx, k=k, x=x: (
                f"{name}[{_flat([*idx[:axis], str(k), *idx[axis:]], out.shape, ostr)}] = "
                f"{self.s_at(x, _flat(idx, x.shape))};"))

    def _p_unstack(self, e):
        (a,) = e.ins
        axis = int(e.params["axis"])
        astr = _strides(a.shape)
        for k, out in enumerate(e.outs):
            self._copy_indexed(out, "unstack", lambda idx, k=k: _flat(
                [*idx[:axis], str(k), *idx[axis:]], a.shape, astr), a)

    # -- indexing by integers: data, or constants ----------------------------------------------
    def _index(self, v: _Val, idx: str, e) -> str:
        """An integer index of ``e`` read from the data or a constant (never from w)."""
        r = self.ref(v)
        if r.is_s:
            raise _refusal(e.prim, e.where, f"'{e.prim}' with indices computed from w at "
                           f"{e.where}", "an index computed from w has no derivative: "
                           "compute it from the data (data-only computations may use any "
                           "primitive)")
        x = self.at(v, idx)
        return x if r.is_int else f"int({x})"

    def _start(self, var: str, raw: str, top: int) -> str:
        """Statements: ``var`` = raw clamped into [0, top] (XLA's dynamic_slice and gather)."""
        return (f"int {var} = {raw}; if ({var} < 0) {var} = 0; if ({var} > {top}) "
                f"{var} = {top};")

    def _mode(self, e) -> str:
        mode = str(e.params.get("mode", "")).rsplit(".", 1)[-1].upper()
        if e.params.get("dimension_numbers") is not None and tuple(getattr(
                e.params["dimension_numbers"], "operand_batching_dims", ())):
            raise _refusal(e.prim, e.where, f"'{e.prim}' with batching dimensions at {e.where}")
        return mode

    def _p_gather(self, e):
        """XLA's gather: out-of-range starts clamped (clip, promise_in_bounds) or filled."""
        op, ind = e.ins
        out = e.outs[0]
        dn = e.params["dimension_numbers"]
        mode = self._mode(e)
        offset_dims, collapsed = tuple(dn.offset_dims), tuple(dn.collapsed_slice_dims)
        smap, sizes = tuple(dn.start_index_map), tuple(e.params["slice_sizes"])
        batch_pos = [d for d in range(len(out.shape)) if d not in offset_dims]
        window = [d for d in range(len(op.shape)) if d not in collapsed]
        fill = e.params.get("fill_value")
        fill = _real_literal(float("nan") if fill is None else fill)
        pre = self.fresh("s")

        def body(idx):
            lines, ok = [], []
            bidx = [idx[d] for d in batch_pos]
            for k, d in enumerate(smap):
                raw = self._index(ind, _flat([*bidx, str(k)], ind.shape), e)
                top = op.shape[d] - sizes[d]
                if mode == "FILL_OR_DROP":
                    lines.append(f"const int {pre}_{k} = {raw};")
                    ok.append(f"{pre}_{k} >= 0 && {pre}_{k} <= {top}")
                else:
                    lines.append(self._start(f"{pre}_{k}", raw, top))
            value = self.s_at(op, _window_offset(op.shape, smap, pre, window, offset_dims, idx))
            if ok:
                value = f"({' && '.join(ok)}) ? {value} : S({fill})"
            return lines, value

        if out.size == 1:
            lines, value = body(["0"] * len(out.shape))
            for line in lines:
                self.emit(line)
            self.new_scalar(out, "gather", value)
            return
        name = self.new_array(out, "gather")
        def statement(idx):
            lines, value = body(idx)
            return "{ " + " ".join(lines) + f" {name}[{_flat(idx, out.shape)}] = {value}; }}"
        self.loop(out.shape, statement)

    def _p_scatter_add(self, e):
        """XLA's scatter-add (the gradient of gather): out-of-range updates dropped, or
        clamped in clip mode."""
        op, ind, upd = e.ins
        out = e.outs[0]
        dn = e.params["dimension_numbers"]
        mode = self._mode(e)
        uwin, inserted = tuple(dn.update_window_dims), tuple(dn.inserted_window_dims)
        smap = tuple(dn.scatter_dims_to_operand_dims)
        scatter_pos = [d for d in range(len(upd.shape)) if d not in uwin]
        window = [d for d in range(len(out.shape)) if d not in inserted]
        name = self.new_array(out, "scatter_add")
        self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {self.s_at(op, 'i')};")
        pre = self.fresh("s")

        def body(idx):
            lines, ok = [], []
            sidx = [idx[d] for d in scatter_pos]
            wsize = {d: upd.shape[uwin[window.index(d)]] if d in window else 1
                     for d in range(len(out.shape))}
            for k, d in enumerate(smap):
                raw = self._index(ind, _flat([*sidx, str(k)], ind.shape), e)
                top = out.shape[d] - wsize[d]
                if mode == "CLIP":
                    lines.append(self._start(f"{pre}_{k}", raw, top))
                else:
                    lines.append(f"const int {pre}_{k} = {raw};")
                    ok.append(f"{pre}_{k} >= 0 && {pre}_{k} <= {top}")
            value = self.s_at(upd, _flat(idx, upd.shape))
            target = (f"{name}[{_window_offset(out.shape, smap, pre, window, uwin, idx)}] += "
                      f"{value};")
            if ok:
                target = f"if ({' && '.join(ok)}) {target}"
            return "{ " + " ".join(lines) + " " + target + " }"
        self.loop(upd.shape, body)

    def _starts(self, e, op_shape, sizes, index_vals) -> list[str]:
        """dynamic_slice's starts: one integer each, clamped as XLA does, as variables."""
        out = []
        for k, (v, n, m) in enumerate(zip(index_vals, op_shape, sizes)):
            var = self.fresh(f"start{k}")
            self.emit(self._start(var, self._index(v, "0", e), n - m))
            out.append(var)
        return out

    def _p_dynamic_slice(self, e):
        op, *index_vals = e.ins
        out = e.outs[0]
        starts = self._starts(e, op.shape, out.shape, index_vals)
        astr = _strides(op.shape)
        self._copy_indexed(out, "dynamic_slice", lambda idx: _flat(
            [f"({s} + {i})" if i != "0" else s for s, i in zip(starts, idx)], op.shape, astr),
            op)

    def _p_dynamic_update_slice(self, e):
        op, upd, *index_vals = e.ins
        out = e.outs[0]
        starts = self._starts(e, op.shape, upd.shape, index_vals)
        name = self.new_array(out, "dynamic_update_slice")
        self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {self.s_at(op, 'i')};")
        def at(idx):
            return _flat([f"({s} + {i})" if i != "0" else s for s, i in zip(starts, idx)],
                         out.shape)
        self.loop(upd.shape, lambda idx: (
            f"{name}[{at(idx)}] = {self.s_at(upd, _flat(idx, upd.shape))};"))

    def _reduce(self, e, kind):
        (a,) = e.ins
        out = e.outs[0]
        axes = tuple(int(x) for x in e.params["axes"])
        count = int(np.prod([a.shape[k] for k in axes], dtype=np.int64))
        keep = [k for k in range(len(a.shape)) if k not in axes]
        if self.is_scalar(a):
            expr = self.s_at(a, "0")
            if kind == "sum":
                expr = f"{expr} * Real({count})"
            self.new_scalar(out, "reduce_" + kind, expr)
            return
        if kind == "sum":
            init, update = "S(Real(0))", lambda o, x: f"{o} += {x};"
        else:
            op = ">" if kind == "max" else "<"
            init = f"S(Real({'-' if kind == 'max' else ''}HUGE_VAL))"
            update = lambda o, x: f"{o} = select(value_of({x}) {op} value_of({o}), {x}, {o});"  # noqa: E731
        if out.size == 1:
            name = self.new_scalar(out, "reduce_" + kind, init, const=False)
            self.emit(f"for (int i = 0; i < {a.size}; ++i) {update(name, self.at(a, 'i'))}")
            return
        name = self.new_array(out, "reduce_" + kind)
        ostr = _strides(out.shape)
        self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {init};")
        self.loop(a.shape, lambda idx: update(
            f"{name}[{_flat([idx[k] for k in keep], out.shape, ostr)}]",
            self.at(a, _flat(idx, a.shape))))

    def _p_reduce_sum(self, e):
        self._reduce(e, "sum")

    def _p_reduce_max(self, e):
        self._reduce(e, "max")

    def _p_reduce_min(self, e):
        self._reduce(e, "min")

    def _p_dot_general(self, e):
        lhs, rhs = e.ins
        out = e.outs[0]
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
        lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
        rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
        if not lb and self._dense(e, lhs, rhs, lc, rc, lf, rf, out):
            return
        # The general case: loops over the output, a sum over the contracted axes.
        K = [lhs.shape[d] for d in lc]
        ls, rs = _strides(lhs.shape), _strides(rhs.shape)
        ob = len(lb)

        def operands(oidx, kidx):
            li, ri = ["0"] * len(lhs.shape), ["0"] * len(rhs.shape)
            for n, (dl, dr) in enumerate(zip(lb, rb)):
                li[dl] = ri[dr] = oidx[n]
            for n, d in enumerate(lf):
                li[d] = oidx[ob + n]
            for n, d in enumerate(rf):
                ri[d] = oidx[ob + len(lf) + n]
            for n, (dl, dr) in enumerate(zip(lc, rc)):
                li[dl] = ri[dr] = kidx[n]
            return (self.at(lhs, _flat(li, lhs.shape, ls)), self.at(rhs, _flat(ri, rhs.shape, rs)))

        kcount = int(np.prod(K, dtype=np.int64))
        if kcount == 1:
            def prod(oidx):
                a, b = operands(oidx, ["0"] * len(K))
                return f"{a} * {b}"
            if out.size == 1:
                self.new_scalar(out, "dot_general", prod(["0"] * len(out.shape)))
            else:
                name = self.new_array(out, "dot_general")
                self.loop(out.shape, lambda o: f"{name}[{_flat(o, out.shape)}] = {prod(o)};")
            return
        # acc = sum_k; one accumulator per output element
        kvars = [f"k{n}" if K[n] != 1 else "0" for n in range(len(K))]

        def body(oidx, target):
            a, b = operands(oidx, kvars)
            loops = "".join(f"for (int {v} = 0; {v} < {n}; ++{v}) " for v, n in zip(kvars, K)
                            if v != "0")
            return f"{loops}{target} += {a} * {b};"
        if out.size == 1:
            name = self.new_scalar(out, "dot_general", "S(Real(0))", const=False)
            self.emit(body(["0"] * len(out.shape), name))
            return
        name = self.new_array(out, "dot_general")
        self.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = S(Real(0));")
        self.loop(out.shape, lambda o: body(o, f"{name}[{_flat(o, out.shape)}]"), pre="o")

    def _dense(self, e, lhs, rhs, lc, rc, lf, rf, out) -> bool:
        """Data (Real array field) times w-dependent array through matvec_rows / matvec_cols."""
        rl, rr = self.ref(lhs), self.ref(rhs)
        if not rl.is_s and rr.is_s:
            D, Dc, Df, Sv, Sc, Sf, data_lhs = lhs, lc, lf, rhs, rc, rf, True
        elif rl.is_s and not rr.is_s:
            D, Dc, Df, Sv, Sc, Sf, data_lhs = rhs, rc, rf, lhs, lc, lf, False
        else:
            return False
        rd, rsv = self.ref(D), self.ref(Sv)
        if rd.kind != "array" or rd.is_int or rsv.kind != "array" or not Dc:
            return False
        if list(Dc) != sorted(Dc) or list(Df) != sorted(Df):
            return False
        K = int(np.prod([D.shape[d] for d in Dc], dtype=np.int64))
        M = int(np.prod([D.shape[d] for d in Df], dtype=np.int64))
        N = int(np.prod([Sv.shape[d] for d in Sf], dtype=np.int64))
        if K < 2 or M < 2:
            return False
        if not Df or max(Df) < min(Dc):
            form = "rows"   # D is (M, K)
        elif max(Dc) < min(Df):
            form = "cols"   # D is (K, M)
        else:
            return False
        ss = _strides(Sv.shape)
        contiguous_s = list(Sc) == sorted(Sc) and (not Sf or max(Sf) < min(Sc)) and \
            list(Sf) == sorted(Sf)
        name = self.new_array(out, "dot_general")
        # out is (M, N) when the data are lhs, (N, M) when they are rhs
        contiguous_o = (not data_lhs) or N == 1
        s_vec = None if contiguous_s else self.temp(K, "column")
        o_vec = None if contiguous_o else self.temp(M, "product")
        dptr = rd.name
        self.emit(f"for (int n = 0; n < {N}; ++n) {{" if N > 1 else "{")
        nvar = "n" if N > 1 else "0"
        if contiguous_s:
            terms = [t for t in (rsv.name, str(rsv.offset) if rsv.offset else "",
                                 f"n * {K}" if N > 1 else "") if t]
            sp = " + ".join(terms)
        else:
            gather = " + ".join(t for t in (
                _unravel(nvar, [Sv.shape[d] for d in Sf], [ss[d] for d in Sf]) if N > 1 else "0",
                _unravel("k", [Sv.shape[d] for d in Sc], [ss[d] for d in Sc])) if t != "0") or "0"
            self.emit(f"  for (int k = 0; k < {K}; ++k) {s_vec}[k] = {self.at(Sv, gather)};")
            sp = s_vec
        if contiguous_o:
            op = name if (data_lhs or N == 1) else f"{name} + n * {M}"
        else:
            op = o_vec
        if form == "rows":
            self.emit(f"  matvec_rows({dptr}, {M}, {K}, {sp}, {op});")
        else:
            self.emit(f"  matvec_cols({dptr}, {K}, {M}, {sp}, {op});")
        if not contiguous_o:
            self.emit(f"  for (int m = 0; m < {M}; ++m) {name}[m * {N} + n] = {o_vec}[m];")
        self.emit("}")
        return True


# -- the header ---------------------------------------------------------------------------------
def _header(cg: _Codegen, loss_name: str, where: str, w_shape, inputs, groups) -> str:
    import jax
    work = cg.allocate()
    body = "\n".join(cg.lines)
    for buf in cg.buffers:
        target = "g" if buf.in_g else ("work" if buf.offset == 0 else f"work + {buf.offset}")
        body = body.replace(buf.token, target)
    members, decls, checks = [], [], []
    for name, x, kind, is_int in cg.fields:
        what = f"data {x.input_name}" if x.input_name is not None else \
            f"{x.producer.prim} of the data" if x.producer is not None else "a constant"
        if x.producer is not None:
            what += f" [{x.producer.where}]"
        if kind == "scalar":
            members.append(f"  {'int' if is_int else 'Real'} {name};  // {what}")
            decls.append(f"PYSHARP_SCALAR({name})")
        else:
            ext = [f"{name}_{k}" for k in range(len(x.shape))]
            members.append(f"  const {'int' if is_int else 'Real'}* {name};  // "
                           f"{tuple(x.shape)}: {what}")
            members.append(f"  int {', '.join(ext)};")
            decls.append(f"PYSHARP_ARRAY({name}, {', '.join(ext)})")
            checks += [f"{e} == {n}" for e, n in zip(ext, x.shape)]
    data_desc = ", ".join(f"{k} {tuple(s)}" for k, s in inputs) or "none"
    lines = [
        f"// Generated by pysharp.models.from_jax (jax {jax.__version__}) from the JAX loss "
        f"`{loss_name}`",
        f"// [{where}]: do not edit; regenerate it instead.",
        f"// w: {tuple(w_shape)} (flattened to {cg.D}); data: {data_desc}.",
        "// Each statement of loss_grad is one equation of jax.value_and_grad(loss)'s jaxpr "
        "that depends on w",
        "// (its primitive, shape and source line in the comment above it). Values that "
        "depend on the data",
        "// only were computed by JAX when the model was built and are bound as fields.",
        "#include <pysharp/model.hpp>",
        "",
        "template <class Real>",
        f"struct {cg.struct} {{",
        *members,
        "",
        f"  PYSHARP_HD int dim() const {{ return {cg.D}; }}",
        f"  PYSHARP_HD int work_size() const {{ return {max(work, 1)}; }}",
    ]
    G = len(groups) - 1 if groups is not None else 1
    if G > 1:
        lines.append(f"  PYSHARP_HD int n_groups() const {{ return {G}; }}")
    if G > 1 and not equal_blocks(groups):  # offsets of blocks of unequal sizes
        lines += ["  PYSHARP_HD int group_begin(int k) const {",
                  f"    constexpr int begin[] = {{{', '.join(str(int(b)) for b in groups)}}};",
                  "    return begin[k];", "  }"]
    lines += [
        "",
        "  template <class S>",
        "  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {",
        "    (void)w;",
        "    (void)work;",
    ]
    if checks:
        lines.append(f"    if (!({' && '.join(checks)})) return mask_t<S>(false);  "
                     "// shapes fixed at trace time")
    lines += [body, "    return pysharp::is_finite(value_of(*loss));", "  }", "};",
              f"PYSHARP_MODEL({cg.struct}{''.join(', ' + d for d in decls)})", ""]
    return "\n".join(lines)


@contextlib.contextmanager
def _x64(jax):
    with _jax_x64(jax):
        yield


def _struct_name(loss) -> str:
    name = re.sub(r"\W", "_", getattr(loss, "__name__", "loss") or "loss").strip("_") or "loss"
    return f"Jax_{name}"


@dataclass
class _Traced:
    source: str
    struct: str
    fields: dict
    jaxpr: Any


def _trace(loss, w, data: dict, groups) -> _Traced:
    import jax
    import jax.numpy as jnp

    arrays = {k: v for k, v in data.items() if not _static(v)}
    static = {k: v for k, v in data.items() if _static(v)}
    shape = w.shape

    def value_and_grad(wf, arrs):
        f = lambda x: loss(x.reshape(shape), **arrs, **static)  # noqa: E731
        return jax.value_and_grad(f)(wf)

    with _x64(jax):
        wf = jnp.asarray(w.reshape(-1), dtype=jnp.float64)
        traced = {k: _as_jax(jnp, v) for k, v in arrays.items()}
        closed = jax.make_jaxpr(value_and_grad)(wf, traced)
        names = sorted(traced)  # the pytree order of a dict
        w_val = _Val(tuple(wf.shape), np.dtype(np.float64), wdep=True)
        data_vals = [_Val(tuple(traced[k].shape), np.dtype(traced[k].dtype), datadep=True,
                          input_name=k) for k in names]
        prog = _Program(closed, w_val, data_vals)
        loss_val, grad_val = prog.outs
        if loss_val.shape not in ((), (1,)):
            raise ValueError(f"loss must return a scalar, got shape {loss_val.shape}")
        cg = _Codegen(prog, w_val, int(wf.shape[0]), _struct_name(loss))
        cg.refs[id(w_val)] = _Ref("array", "w", is_s=True)
        cg.plan()
        # Data-only equations: evaluated by JAX, now.
        env: dict[int, Any] = {id(v): traced[v.input_name] for v in data_vals}

        def read(x):
            if x.const is not None:
                return x.const
            return env[id(x)]
        for e in cg.fold:
            je = e.jax_eqn
            bind = je.primitive.get_bind_params(je.params)
            subfuns, params = ((), bind) if isinstance(bind, dict) else bind
            res = je.primitive.bind(*subfuns, *[read(x) for x in e.ins], **params)
            res = res if je.primitive.multiple_results else [res]
            for o, r in zip(e.outs, res):
                env[id(o)] = r
        values = {id(x): np.asarray(read(x)) for x in cg.frontier if x.const is not None
                  or id(x) in env}
        cg.bind_constants(values)
        cg.generate()
        inputs = [(k, traced[k].shape) for k in names]
        where = getattr(getattr(loss, "__code__", None), "co_filename", "?")
        line = getattr(getattr(loss, "__code__", None), "co_firstlineno", 0)
        source = _header(cg, getattr(loss, "__qualname__", "loss"),
                         f"{os.path.basename(where)}:{line}", shape, inputs, groups)
        fields = {}
        for name, x, kind, is_int in cg.fields:
            a = np.asarray(read(x))
            if is_int:
                fields[name] = int(a) if kind == "scalar" else a.astype(np.int32)
            else:
                fields[name] = float(a) if kind == "scalar" else np.ascontiguousarray(
                    a, dtype=np.float64)
    return _Traced(source, cg.struct, fields, closed)


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
        with _x64(jax):
            closed = jax.make_jaxpr(lambda x, a: loss(x.reshape(w.shape), **a, **static))(
                jnp.asarray(w.reshape(-1), dtype=jnp.float64),
                {k: _as_jax(jnp, v) for k, v in arrays.items()})
        names = sorted(arrays)
        return walk(closed, [True] + [False] * len(names))
    except Exception:  # noqa: BLE001 - a diagnosis only: the check's report stands alone
        return found


def _parting(report, suspects: list[str]) -> str:
    """Where the model and JAX first part, in words, for the check's failure."""
    order = ("loss", "gradient", "hvp", "third")
    first = next((k for k in order if not report.passed[k]), "loss")
    what = {"loss": "the loss", "gradient": "the gradient", "hvp": "H v",
            "third": "D^3L[v, v]"}[first]
    text = f"The model and JAX first part in {what}"
    if not suspects:
        return text + (": no custom rule or cast below float64 acts on w, so this is a "
                       "translation bug: please report it with the header. Meanwhile, "
                       f"{_UNTRACED}.")
    return text + ", at the equations where they can:\n" + "\n".join(
        f"  - {s}" for s in suspects) + f"\nOr {_UNTRACED}."


def _flat_parameters(w_example) -> np.ndarray:
    """``w_example`` as one float64 array; a pytree of arrays (a tuple ``(W1, a)``, a dict of
    layers) is refused with the lines that flatten it and unpack it inside the loss."""
    parts = (w_example if isinstance(w_example, dict) else
             dict(enumerate(w_example)) if isinstance(w_example, (tuple, list)) else None)
    try:
        shapes = {k: np.shape(v) for k, v in parts.items()} if parts else {}
    except ValueError:  # ragged nesting
        shapes = None
    if parts is not None and (shapes is None or any(len(v) > 0 for v in shapes.values())
                              or isinstance(w_example, dict)):
        what = f"a {type(w_example).__name__} of {len(parts)} arrays"
        how = ""
        if shapes is not None:
            start, lines = 0, []
            for k, shape in shapes.items():
                size = math.prod(shape)
                name = k if isinstance(k, str) and k.isidentifier() else f"p{k}"
                lines.append(f"    {name} = w[{start}:{start + size}]"
                             + (f".reshape{shape}" if len(shape) > 1 else ""))
                start += size
            what += f" (shapes {', '.join(str(v) for v in shapes.values())})"
            values = "w_example.values()" if isinstance(w_example, dict) else "w_example"
            how = (f" Pass np.concatenate([np.ravel(p) for p in {values}]) (D = {start}) and "
                   "unpack inside the loss:\n" + "\n".join(lines))
        raise TypeError(f"from_jax takes the parameters as one flat array; w_example is "
                        f"{what}: pytrees of parameters are not supported yet.{how}")
    try:
        return np.asarray(w_example, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"w_example must be an array of real numbers: {exc}") from None


def _static(v) -> bool:
    return isinstance(v, (bool, int, np.integer)) and not isinstance(v, np.ndarray)


def _as_jax(jnp, v):
    a = np.asarray(v)
    if a.dtype.kind == "f" or isinstance(v, numbers.Real) and a.dtype.kind == "f":
        return jnp.asarray(a, dtype=jnp.float64)
    if a.dtype.kind in "biu":
        return jnp.asarray(a)
    raise TypeError(f"data must be real arrays or numbers, got dtype {a.dtype}")


def _write_header(text: str, struct: str) -> Path:
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    path = cache_dir() / "jax" / f"{struct}_{digest}.hpp"
    if not path.is_file() or path.read_text() != text:
        write_private(path, text.encode())  # 0600, in a 0700 folder; says if read-only
    return path


class JaxModel(LoadedModel):
    """A model traced from a JAX loss by :func:`from_jax`; a :class:`LoadedModel` with

    Attributes
    ----------
    source : str
        The generated header (also at ``header``).
    loss_fn : callable
        The JAX loss it was traced from; ``data`` the data it was bound to.
    jaxpr : jax.core.ClosedJaxpr
        The traced ``jax.value_and_grad(loss)``.
    report : CheckReport or None
        The check against JAX run by ``from_jax`` (None with ``check=False``).
    """

    def __init__(self, header, *, fields, dtype, model_name, source, loss_fn, data, jaxpr,
                 w_shape) -> None:
        super().__init__(header, fields=fields, dtype=dtype, model_name=model_name)
        self.source = source
        self.loss_fn = loss_fn
        self.data = data
        self.jaxpr = jaxpr
        self.w_shape = tuple(w_shape)
        self.report = None

    def __repr__(self) -> str:
        """The loss by its name and the data by the keywords the user passed (arrays by
        shape), not the header's generated fields."""
        def shown(v):
            a = np.asarray(v) if not _static(v) else None
            return str(a.shape) if a is not None and a.ndim else repr(
                a.item() if a is not None else v)
        data = ", ".join(f"{k}={shown(v)}" for k, v in self.data.items())
        w = f"w={self.w_shape}, " if len(self.w_shape) != 1 else ""
        name = getattr(self.loss_fn, "__qualname__", "loss")
        return f"JaxModel({name}<{self.dtype.name}>: {w}{data}, dim={self.dim})"

    def reference(self) -> Callable:
        """``f(w)`` for flat w: the JAX loss bound to this model's data."""
        return _BoundLoss(self.loss_fn, self.data, self.w_shape)

    def unravel(self, w):
        """The parameters of a flat w (D,) in the shape the loss takes them (a pytree's
        model, from ``from_jax(..., compile=True)``, gives its pytree back)."""
        return np.asarray(w).reshape(self.w_shape)


#: (loss, its static arguments, w's shape) -> jit(vmap(derivatives)), most recent last
_DERIVATIVES: dict = {}


def _derivatives(loss, static: dict, shape: tuple):
    """(loss, grad, H v, D^3L[v, v]) of ``loss`` at points W (P, D) along V (P, D), with
    the data an argument: one XLA compile per function, static arguments and shapes
    (``jax.jit`` caches by shapes), reused by the check of every model of new data."""
    import jax
    import jax.numpy as jnp

    key = (loss, tuple(sorted(static.items())), shape)
    if key in _DERIVATIVES:
        _DERIVATIVES[key] = _DERIVATIVES.pop(key)
        return _DERIVATIVES[key]

    def one(w, v, arrays):
        def f(x):
            return jnp.reshape(loss(x.reshape(shape), **arrays, **static), ())
        value, g = jax.value_and_grad(f)(w)
        hv, d3 = jax.jvp(lambda y: jax.jvp(jax.grad(f), (y,), (v,))[1], (w,), (v,))
        return value, g, hv, d3

    _DERIVATIVES[key] = jax.jit(jax.vmap(one, in_axes=(0, 0, None)))
    while len(_DERIVATIVES) > 32:
        _DERIVATIVES.pop(next(iter(_DERIVATIVES)))
    return _DERIVATIVES[key]


class _BoundLoss:
    """``f(w)`` for flat w: a JAX loss bound to its data; ``derivatives`` evaluates the
    check's reference values at all its points in one compiled call."""

    def __init__(self, loss, data: dict, shape) -> None:
        self.loss, self.data, self.shape = loss, data, tuple(shape)

    def __call__(self, w):
        return self.loss(w.reshape(self.shape), **self.data)

    def derivatives(self, W, V):
        """(loss (P,), grad, H v, D^3L[v, v] (P, D)) at the rows of W along those of V;
        call in 64-bit mode."""
        import jax.numpy as jnp
        static = {k: v for k, v in self.data.items() if _static(v)}
        arrays = {k: _as_jax(jnp, v) for k, v in self.data.items() if not _static(v)}
        fn = _derivatives(self.loss, static, self.shape)
        return fn(jnp.asarray(W, dtype=jnp.float64), jnp.asarray(V, dtype=jnp.float64), arrays)


def from_jax(loss: Callable, w_example, *, check: bool = True, dtype="float64",
             groups: int | list | None = None, check_points: int = 3, **data) -> JaxModel:
    """A compiled model from a loss written in JAX.

    ``jax.value_and_grad(loss)`` is traced (float64) to a jaxpr and translated,
    equation by equation, into a model header of the documented form (see
    ``model.source``), compiled once per function and shapes and loaded like
    :func:`load_model`'s models: every tool of pysharp runs on it, with the exact
    HVP and D^3L[v, v] of the traced gradient (the engine's jets).

    Parameters
    ----------
    loss : callable
        ``loss(w, **data) -> scalar`` written with ``jax.numpy``.
    w_example : array_like
        A point of the parameter shape; the model's w is its flattening (D values).
        One array: a pytree of parameters (a tuple ``(W1, a)``, a dict) is refused
        with the lines that flatten it and unpack it inside the loss.
    check : bool
        Compare the model with JAX (``pysharp.models.check``: loss, gradient, H v,
        D^3L[v, v] at ``check_points`` random points) and raise if they differ.
    dtype : {"float64", "float32"}
        The precision the model is compiled in first.
    groups : int or list, optional
        Declare the loss invariant to the scale of each of these contiguous blocks
        of w separately, so that runs record each block's squared norm
        (``Trajectory.group_norm2``) and ``check`` verifies each: an int G (G equal
        blocks, ``n_groups()``: a two-layer net's rows), a list of sizes summing to
        D (``[30, 6]``: a 6 x 5 weight matrix and a readout of 6) or a list of
        ``(start, stop)`` ranges tiling w in order (``[(0, 30), (30, 36)]``); blocks
        of unequal sizes are declared by ``group_begin(k)`` in the header.
    **data
        Arrays and floats are data: traced with fixed shapes and bound as fields,
        so new values of the same shapes reuse the compiled module. Python ints
        and bools are static (part of the function, like ``jax.jit``'s static
        arguments).

    Raises
    ------
    TypeError
        ``w_example`` is a pytree, or data are not real.
    ValueError
        Data with a non-finite entry (the keyword and the first index named);
        ``groups`` that do not tile w (a gap, an overlap, the wrong total, named).
    UnsupportedPrimitive
        A primitive outside the supported subset (``SUPPORTED``) on a value that
        depends on w, named with its source line, before anything is compiled.
    AssertionError
        ``check`` found the model off JAX (a translation bug: please report it).
    """
    import jax  # noqa: F401 - ImportError here says what is missing

    w = _flat_parameters(w_example)
    for name, value in data.items():
        if not _static(value):
            check_real_data(name, value, _dtype_name(dtype))
            if isinstance(value, np.floating) or getattr(value, "dtype", None) is not None \
                    and np.dtype(value.dtype).kind == "f":  # float32: the warned values, exactly
                data[name] = np.asarray(value, dtype=np.float64)
    if w.size < 1:
        raise ValueError("w_example must have at least one entry")
    bounds = group_bounds(groups, w.size) if groups is not None else None
    traced = _trace(loss, w, data, bounds)
    header = _write_header(traced.source, traced.struct)
    model = JaxModel(header, fields=traced.fields, dtype=dtype, model_name=traced.struct,
                     source=traced.source, loss_fn=loss, data=dict(data), jaxpr=traced.jaxpr,
                     w_shape=w.shape)
    if check:
        report = run_check(model, model.reference(), framework="jax", points=check_points)
        model.report = report
        compared = ("loss", "gradient", "hvp", "third")
        if not all(report.passed[k] for k in compared):
            where = _parting(report, _suspects(loss, w, data))
            raise AssertionError(f"from_jax: the generated model differs from JAX "
                                 f"({model.header}). {where}\n{report}")
        if not all(report.passed.values()):
            warnings.warn(f"from_jax: the model equals JAX's loss, but the loss is not "
                          f"scale-invariant:\n{report}", stacklevel=2)
    return model


__all__ = ["from_jax", "JaxModel", "UnsupportedPrimitive", "SUPPORTED"]


def from_jax_file(target: str, dim: int, data=None, params: dict | None = None, *,
                  base=None, source: str = "--param", **options) -> JaxModel:
    """:func:`from_jax` on a loss named ``FILE.py:FUNCTION``, for the command line and
    sweep configs (``pysharp run my_models.py:loss --dim 40 --data data.npz``).

    Parameters
    ----------
    target : str
        ``path/to/file.py:function``; the path relative to ``base``.
    dim : int
        The number of parameters D (w is traced as a vector of D values).
    data, params, base, source
        As :func:`pysharp.models.load_model_files`: an ``.npz`` of arrays and numbers
        by name (ints are static arguments of the loss, floats and arrays data).
    **options
        Further keywords of :func:`from_jax` (``groups``, ``dtype``, ``check``).
    """
    import importlib.util

    path, sep, name = str(target).rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"a JAX model is named FILE.py:FUNCTION, got {target!r}")
    base = Path(base) if base is not None else Path.cwd()
    file = base / Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"no Python file at {file}")
    spec = importlib.util.spec_from_file_location(f"_pysharp_user_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loss = getattr(module, name, None)
    if not callable(loss):
        raise ValueError(f"{file.name} defines no function {name!r}")
    fields = fields_from_files(data, params, base=base, source=source)
    return from_jax(loss, np.ones(int(dim)), **options, **fields)
