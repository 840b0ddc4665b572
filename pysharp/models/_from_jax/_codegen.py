"""C++ text of the generated model: expressions, loops, names and the work buffer.

:class:`_Codegen` holds how each traced value is read in the generated code (a scalar
variable, an array in ``work``, a field of the data, an inlined constant), writes the
statements the primitive translators (:mod:`._primitives`) ask for, and allocates the
buffers in ``work``, reusing one once every reader is done.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable

import numpy as np

from ._jaxpr import _Eqn, _Program, _Val

#: Names the generated code uses itself: a field or variable never takes them.
_RESERVED = {"w", "loss", "g", "work", "S", "Real", "dim", "work_size", "loss_grad", "n_groups",
             "group_begin",
             "value_of", "select", "sqrt_", "exp_", "expm1_", "log_", "log1p_", "tanh_", "sin_",
             "cos_", "matvec_rows",
             "matvec_cols", "mask_t", "pysharp", "erf_", "erfc_", "atan2_"}


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


#: A primitive's translator: writes the statements of one equation through the codegen.
Translator = Callable[["_Codegen", _Eqn], None]


class _Codegen:
    """The statements of ``loss_grad`` for the equations of ``prog`` that depend on w,
    each written by its primitive's translator of ``table``."""

    def __init__(self, prog: _Program, w_val: _Val, D: int, struct: str,
                 table: dict[str, Translator]) -> None:
        self.prog = prog
        self.table = table
        self.D = D
        self.struct = struct
        self.refs: dict[int, _Ref] = {id(w_val): _Ref("array", "w", is_s=True)}
        self.lines: list[str] = []
        self.buffers: list[_Buffer] = []
        self.names: set[str] = set(_RESERVED)
        self.counter = 0
        self.fields: list[tuple] = []   # (name, value, kind, is_int)
        self.constants: dict[int, float] = {}  # uniform constants inlined (not data), by id
        # pysharp's functions the statements call that model.hpp does not bring to the
        # global namespace (a plain-Real S finds them only through a using-declaration)
        self.functions: set[str] = set()
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

    # defining values
    def new_array(self, v: _Val, base: str) -> str:
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
        """out is read where src is (at ``offset`` into it); one element of an array
        broadcast to more (a scan's step of a cotangent, z[2] * ones) is read as a scalar,
        not as the array from that element on."""
        r = self.ref(src)
        if r.kind == "array" and src.size == 1 and out.size > 1:
            self.refs[id(out)] = _Ref("scalar", f"{r.name}[{r.offset + offset}]", is_s=r.is_s,
                                      buffer=r.buffer, is_int=r.is_int)
        else:
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

    def copy_indexed(self, out: _Val, base: str, src_index: Callable[[list[str]], str],
                     src: _Val) -> None:
        """out[idx] = src[src_index(idx)] over out's multi-indices (one scalar when either
        is one)."""
        if out.size == 1 or self.is_scalar(src):
            self.new_scalar(out, base, self.s_at(src, src_index(["0"] * len(out.shape))))
            return
        name = self.new_array(out, base)
        self.loop(out.shape, lambda idx: f"{name}[{_flat(idx, out.shape)}] = "
                                         f"{self.at(src, src_index(idx))};")

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
        """Storage of the frontier values (``values``, by id): uniform constants inline, the
        rest fields."""
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

    def generate(self) -> None:
        self.starts: list[int] = []  # where each equation's statements begin in lines
        for k, e in enumerate(self.code):
            self.step = k
            self.starts.append(len(self.lines))
            where = e.where.replace("\n", " ")
            shapes = ", ".join(f"{o.dtype.name}{list(o.shape)}" for o in e.outs)
            self.lines.append(f"    // {e.prim} -> {shapes}   [{where}]")
            self.table[e.prim](self, e)
        self.place_grad()
        loss_val, grad_val = self.prog.outs
        self.step = len(self.code)
        self.starts.append(len(self.lines))
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
