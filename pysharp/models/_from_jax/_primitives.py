"""The primitive translation table: each primitive of jax's traced gradient that depends
on w, as C++ statements of the generated model, and the refusals of the others.

``TABLE`` maps a primitive's name to its translator, ``f(cg, eqn)``, which writes the
equation through the codegen (:class:`._codegen._Codegen`); ``SUPPORTED`` lists them. A
primitive outside it on a value that depends on w is refused before anything is compiled,
with the user's line and the way forward (:func:`_refusal`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from ._codegen import (
    Translator,
    _Codegen,
    _constant_power,
    _flat,
    _integer_power,
    _real_literal,
    _strides,
    _unravel,
    _window_offset,
)
from ._jaxpr import _Eqn, _Val


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
    "sort": "where the order is fixed by the data, sort by the data: lax.sort_key_val(t, z) or "
            "z[jnp.argsort(t)] with t data (data-only computations may use any primitive)",
    "cumlogsumexp": "jax.nn.logsumexp over masked copies: logsumexp(jnp.where(T, z, -jnp.inf), "
                    "axis=1) with T = jnp.tril(jnp.ones((n, n), bool))",
    "argmax": "the index of a maximum is piecewise constant: compute it from the data, or use "
              "jnp.max's value",
    "while": "a while_loop has no static trip count: lax.fori_loop(0, n, body, x) with Python "
             "int bounds, or lax.scan with a fixed length, compiles (unrolled)",
    "cond": "both branches with jnp.where(pred, a, b) (they are evaluated, then chosen)",
    "reduce_prod": "jnp.prod(z) of positive z as jnp.exp(jnp.sum(jnp.log(z)))",
    "random_bits": "draw the random numbers outside the loss and pass them as data",
}
_REWRITES.update({k: _REWRITES["argmax"] for k in ("argmin",)})
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


#: primitive name -> translator, in the order they are registered below
TABLE: dict[str, Translator] = {}


def _translates(*prims: str) -> Callable[[Translator], Translator]:
    """Registers the decorated function as the translator of ``prims``."""
    def register(fn: Translator) -> Translator:
        for p in prims:
            TABLE[p] = fn
        return fn
    return register


def _binary(cg: _Codegen, e: _Eqn, op: str) -> None:
    a, b = e.ins
    cg.elementwise(e.outs[0], e.prim, lambda i: f"{cg.at(a, i)} {op} {cg.at(b, i)}")


@_translates("add", "add_any")
def _p_add(cg: _Codegen, e: _Eqn) -> None:
    _binary(cg, e, "+")



@_translates("sub")
def _p_sub(cg: _Codegen, e: _Eqn) -> None:
    _binary(cg, e, "-")


@_translates("mul")
def _p_mul(cg: _Codegen, e: _Eqn) -> None:
    _binary(cg, e, "*")


@_translates("div")
def _p_div(cg: _Codegen, e: _Eqn) -> None:
    _binary(cg, e, "/")


def _unary(cg: _Codegen, e: _Eqn, fn: Callable[[str], str]) -> None:
    (a,) = e.ins
    cg.elementwise(e.outs[0], e.prim, lambda i: fn(cg.s_at(a, i)))


@_translates("neg")
def _p_neg(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"-{x}")


@_translates("square")
def _p_square(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"{x} * {x}")


@_translates("integer_pow")
def _p_integer_pow(cg: _Codegen, e: _Eqn) -> None:
    y = int(e.params["y"])
    _unary(cg, e, lambda x: _integer_power(x, y))


@_translates("pow")
def _p_pow(cg: _Codegen, e: _Eqn) -> None:
    a, b = e.ins
    power = _constant_power(cg.constants.get(id(b)))
    if power is None:  # exp(y log x): its derivatives need x > 0, as JAX's do
        cg.elementwise(e.outs[0], "pow_",
                         lambda i: f"exp_({cg.at(b, i)} * log_({cg.s_at(a, i)}))")
    else:
        cg.elementwise(e.outs[0], "pow_", lambda i: power(cg.s_at(a, i)))


@_translates("sqrt")
def _p_sqrt(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"sqrt_({x})")


@_translates("rsqrt")
def _p_rsqrt(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"Real(1) / sqrt_({x})")


@_translates("exp")
def _p_exp(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"exp_({x})")


@_translates("exp2")
def _p_exp2(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"exp_(Real(0.6931471805599453) * {x})")


@_translates("log")
def _p_log(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"log_({x})")


@_translates("log1p")
def _p_log1p(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"log1p_({x})")


@_translates("expm1")
def _p_expm1(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"expm1_({x})")


@_translates("tanh")
def _p_tanh(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"tanh_({x})")


@_translates("sin")
def _p_sin(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"sin_({x})")


@_translates("cos")
def _p_cos(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"cos_({x})")


@_translates("erf", "erfc")
def _p_erf(cg: _Codegen, e: _Eqn) -> None:
    """erf_ / erfc_ (core/activation.hpp): <cmath>'s value, the closed-form derivative's jet."""
    cg.functions.add(e.prim + "_")
    _unary(cg, e, lambda x: f"{e.prim}_({x})")


@_translates("atan2")
def _p_atan2(cg: _Codegen, e: _Eqn) -> None:
    a, b = e.ins
    cg.functions.add("atan2_")
    cg.elementwise(e.outs[0], "atan2", lambda i: f"atan2_({cg.s_at(a, i)}, {cg.s_at(b, i)})")


@_translates("logistic")
def _p_logistic(cg: _Codegen, e: _Eqn) -> None:
    _unary(cg, e, lambda x: f"Real(1) / (Real(1) + exp_(-{x}))")


@_translates("abs")
def _p_abs(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    cg.elementwise(e.outs[0], "abs", lambda i: (
        f"select({cg.v_at(a, i)} >= Real(0), {cg.s_at(a, i)}, -{cg.s_at(a, i)})"))


@_translates("sign")
def _p_sign(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    cg.elementwise(e.outs[0], "sign", lambda i: (
        f"select({cg.v_at(a, i)} > Real(0), S(Real(1)), select({cg.v_at(a, i)} < "
        f"Real(0), S(Real(-1)), S(Real(0))))"))


@_translates("stop_gradient")
def _p_stop_gradient(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    cg.elementwise(e.outs[0], "stop_gradient", lambda i: f"S({cg.v_at(a, i)})")


@_translates("max")
def _p_max(cg: _Codegen, e: _Eqn) -> None:
    a, b = e.ins
    cg.elementwise(e.outs[0], e.prim, lambda i: (
        f"select({cg.v_at(a, i)} > {cg.v_at(b, i)}, {cg.s_at(a, i)}, "
        f"{cg.s_at(b, i)})"))


@_translates("min")
def _p_min(cg: _Codegen, e: _Eqn) -> None:
    a, b = e.ins
    cg.elementwise(e.outs[0], e.prim, lambda i: (
        f"select({cg.v_at(a, i)} < {cg.v_at(b, i)}, {cg.s_at(a, i)}, "
        f"{cg.s_at(b, i)})"))


@_translates("clamp")
def _p_clamp(cg: _Codegen, e: _Eqn) -> None:
    lo, x, hi = e.ins

    def fn(i):
        inner = (f"select({cg.v_at(x, i)} < {cg.v_at(hi, i)}, {cg.s_at(x, i)}, "
                 f"{cg.s_at(hi, i)})")
        return (f"select({cg.v_at(lo, i)} > value_of({inner}), {cg.s_at(lo, i)}, "
                f"{inner})")
    cg.elementwise(e.outs[0], "clamp", fn)


_CMP = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "=="}


@_translates("gt", "lt", "ge", "le", "eq", "ne")
def _p_compare(cg: _Codegen, e: _Eqn) -> None:
    a, b = e.ins
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        raise _refusal(e.prim, e.where, f"'{e.prim}' of non-float values depending on w "
                       f"at {e.where}", "compare float values, or compute the integers "
                       "from the data (data-only computations may use any primitive)")
    if e.prim == "ne":
        cond = lambda i: f"!({cg.v_at(a, i)} == {cg.v_at(b, i)})"  # noqa: E731
    else:
        op = _CMP[e.prim]
        cond = lambda i: f"{cg.v_at(a, i)} {op} {cg.v_at(b, i)}"  # noqa: E731
    # A truth value is held as an S of value 1 or 0 (constant: no derivative).
    cg.elementwise(e.outs[0], e.prim,
                     lambda i: f"select({cond(i)}, S(Real(1)), S(Real(0)))")



@_translates("is_finite")
def _p_is_finite(cg: _Codegen, e: _Eqn) -> None:
    """A guard (jax.nn.logsumexp's): the value tested, a truth value held as 1 or 0."""
    (a,) = e.ins
    cg.elementwise(e.outs[0], "is_finite", lambda i: (
        f"select(pysharp::is_finite({cg.v_at(a, i)}), S(Real(1)), S(Real(0)))"))


def _bool_only(cg: _Codegen, e: _Eqn) -> None:
    if any(x.dtype != np.bool_ for x in e.ins):
        raise _refusal(e.prim, e.where, f"'{e.prim}' of integers depending on w at "
                       f"{e.where}", "combine float masks (a * b, a + b - a * b, 1 - a) "
                       "or compute the integers from the data")


@_translates("and")
def _p_and(cg: _Codegen, e: _Eqn) -> None:
    _bool_only(cg, e)
    a, b = e.ins
    cg.elementwise(e.outs[0], "and_", lambda i: f"{cg.s_at(a, i)} * {cg.s_at(b, i)}")


@_translates("or")
def _p_or(cg: _Codegen, e: _Eqn) -> None:
    _bool_only(cg, e)
    a, b = e.ins
    cg.elementwise(e.outs[0], "or_", lambda i: (
        f"{cg.s_at(a, i)} + {cg.s_at(b, i)} - {cg.s_at(a, i)} * {cg.s_at(b, i)}"))


@_translates("not")
def _p_not(cg: _Codegen, e: _Eqn) -> None:
    _bool_only(cg, e)
    (a,) = e.ins
    cg.elementwise(e.outs[0], "not_", lambda i: f"Real(1) - {cg.s_at(a, i)}")


def _pred(cg: _Codegen, p: _Val, i: str, k: int | None = None) -> str:
    """The truth value 'p selects case 1' (bool p) or 'p == k' (integer p)."""
    r = cg.ref(p)
    if r.is_s:
        return f"value_of({cg.at(p, i)}) > Real(0.5)"
    x = cg.at(p, i)
    if k is None:
        return f"({x} != 0)"
    return f"({x} == {k})"


@_translates("select_n")
def _p_select_n(cg: _Codegen, e: _Eqn) -> None:
    p, *cases = e.ins
    r = cg.ref(p)
    if r.is_s and p.dtype != np.bool_:
        raise _refusal(e.prim, e.where, f"an integer select_n predicate (lax.switch, "
                       f"jnp.select) computed from w at {e.where}",
                       "nested jnp.where(mask, a, b) on float comparisons")
    if r.kind == "scalar" and not r.is_s and not r.name.isidentifier():
        # A constant predicate (inlined literal): the case is known now.
        k = int(float(re.sub(r"Real\((.*)\)", r"\1", r.name)))
        cg.alias(e.outs[0], cases[k]) if cg.ref(cases[k]).is_s else \
            cg.elementwise(e.outs[0], "select_n", lambda i: cg.s_at(cases[k], i))
        return

    def fn(i):
        if len(cases) == 2 and p.dtype == np.bool_:
            return f"select({_pred(cg, p, i)}, {cg.s_at(cases[1], i)}, " \
                   f"{cg.s_at(cases[0], i)})"
        expr = cg.s_at(cases[-1], i)
        for k in range(len(cases) - 2, -1, -1):
            expr = f"select({_pred(cg, p, i, k)}, {cg.s_at(cases[k], i)}, {expr})"
        return expr
    cg.elementwise(e.outs[0], "select_n", fn)


@_translates("convert_element_type")
def _p_convert_element_type(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    out = e.outs[0]
    if out.dtype.kind != "f":
        raise _refusal(e.prim, e.where, f"convert_element_type of a value depending on w "
                       f"to {out.dtype} at {e.where} (only float <-> float and bool -> "
                       "float are differentiable)", "compute the integers from the data "
                       "(data-only computations may use any primitive)")
    cg.alias(out, a)


@_translates("squeeze", "expand_dims", "copy", "copy_p", "reduce_precision")
def _p_alias(cg: _Codegen, e: _Eqn) -> None:
    cg.alias(e.outs[0], e.ins[0])


@_translates("reshape")
def _p_reshape(cg: _Codegen, e: _Eqn) -> None:
    """The same elements in the same order, unless ``dimensions`` permutes the axes first
    (the gradients of grouped convolutions write that)."""
    (a,) = e.ins
    perm = e.params.get("dimensions")
    if perm is None:
        cg.alias(e.outs[0], a)
    else:
        _transposed(cg, e.outs[0], a, tuple(int(p) for p in perm), "reshape")


@_translates("optimization_barrier")
def _p_optimization_barrier(cg: _Codegen, e: _Eqn) -> None:
    for o, x in zip(e.outs, e.ins):
        cg.alias(o, x)


@_translates("broadcast_in_dim")
def _p_broadcast_in_dim(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    out = e.outs[0]
    if cg.is_scalar(a) or a.size == out.size:  # nothing repeats: the same elements
        cg.alias(out, a)
        return
    dims = tuple(e.params["broadcast_dimensions"])
    strides = _strides(a.shape)

    def src(idx):
        return _flat([idx[d] if a.shape[k] != 1 else "0" for k, d in enumerate(dims)],
                     a.shape, strides)
    cg.copy_indexed(out, "broadcast", src, a)


def _transposed(cg: _Codegen, out: _Val, a: _Val, perm: tuple, base: str) -> None:
    """out = a with its axes permuted (out's axis k is a's axis perm[k]), in memory order:
    out may then have any shape of that size (a reshape after the permutation)."""
    strides = _strides(a.shape)
    moved = [p for p in perm if a.shape[p] != 1]
    if cg.is_scalar(a) or moved == sorted(moved):
        cg.alias(out, a)  # only axes of length 1 move
        return
    shape = [a.shape[p] for p in perm]

    def src(idx):
        return " + ".join(f"{idx[k]} * {strides[p]}" if strides[p] != 1 else idx[k]
                          for k, p in enumerate(perm) if idx[k] != "0") or "0"
    name = cg.new_array(out, base)
    cg.loop(shape, lambda idx: f"{name}[{_flat(idx, shape)}] = {cg.at(a, src(idx))};")


@_translates("transpose")
def _p_transpose(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    _transposed(cg, e.outs[0], a, tuple(e.params["permutation"]), "transpose")


def _slice(cg: _Codegen, out: _Val, a: _Val, start, stride, base: str = "slice") -> None:
    strides = _strides(a.shape)
    offset = sum(s0 * st for s0, st in zip(start, strides))
    # Contiguous: axes of length 1 up to some axis p, whole axes after it, strides 1.
    contiguous = all(s == 1 for s in stride)
    p = next((k for k, n in enumerate(out.shape) if n != 1), len(out.shape))
    if any(out.shape[k] != a.shape[k] for k in range(p + 1, len(out.shape))):
        contiguous = False
    if contiguous and not cg.is_scalar(a):
        if cg.ref(a).kind == "array":
            cg.alias(out, a, offset)
            return

    def src(idx):
        terms = [str(offset)] if offset else []
        for k, i in enumerate(idx):
            if i != "0":
                m = stride[k] * strides[k]
                terms.append(i if m == 1 else f"{i} * {m}")
        return " + ".join(terms) or "0"
    cg.copy_indexed(out, base, src, a)


@_translates("slice")
def _p_slice(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    start = tuple(e.params["start_indices"])
    stride = tuple(e.params["strides"] or (1,) * len(start))
    _slice(cg, e.outs[0], a, start, stride)


@_translates("split")
def _p_split(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    axis = int(e.params["axis"])
    pos = 0
    for out, size in zip(e.outs, e.params["sizes"]):
        start = [0] * len(a.shape)
        start[axis] = pos
        if id(out) in cg.last_use:
            _slice(cg, out, a, start, (1,) * len(a.shape), "split")
        pos += int(size)


@_translates("concatenate")
def _p_concatenate(cg: _Codegen, e: _Eqn) -> None:
    out = e.outs[0]
    dim = int(e.params["dimension"])
    if out.size == 1:
        (a,) = [x for x in e.ins if x.size == 1]
        cg.new_scalar(out, "concatenate", cg.s_at(a, "0"))
        return
    name = cg.new_array(out, "concatenate")
    ostr = _strides(out.shape)
    pos = 0
    for x in e.ins:
        if x.size:
            base = pos * ostr[dim]
            cg.loop(x.shape, lambda idx, x=x, base=base: (
                f"{name}[{(str(base) + ' + ') if base else ''}{_flat(idx, x.shape, ostr)}]"
                f" = {cg.at(x, _flat(idx, x.shape))};"))
        pos += x.shape[dim]


@_translates("pad")
def _p_pad(cg: _Codegen, e: _Eqn) -> None:
    """Padding in both directions: a negative pad drops elements (the gradient's
    transpose of a positive pad), interior padding spaces them."""
    a, value = e.ins
    out = e.outs[0]
    config = [tuple(int(c) for c in cfg) for cfg in e.params["padding_config"]]
    if all(lo <= 0 and hi <= 0 and it == 0 for lo, hi, it in config):
        _slice(cg, out, a, [-lo for lo, _, _ in config], (1,) * len(config), "pad")
        return
    name = cg.new_array(out, "pad")
    cg.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {cg.s_at(value, '0')};")
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
            cg.emit("  " * depth + f"for (int {var} = {first}; {var} < {stop}; ++{var})")
            depth += 1
        idx.append(var)
        if var != "0" and m != 1:
            dst.append(var if step * ostr[k] == 1 else f"{var} * {step * ostr[k]}")
    if const:
        dst.append(f"({const})")
    cg.emit("  " * depth + f"{name}[{' + '.join(dst) or '0'}] = "
              f"{cg.s_at(a, _flat(idx, a.shape))};")


@_translates("rev")
def _p_rev(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    dims = {int(d) for d in e.params["dimensions"]}
    astr = _strides(a.shape)
    cg.copy_indexed(e.outs[0], "rev", lambda idx: _flat(
        [f"({a.shape[k] - 1} - {i})" if k in dims and i != "0" else i
         for k, i in enumerate(idx)], a.shape, astr), a)


@_translates("stack")
def _p_stack(cg: _Codegen, e: _Eqn) -> None:
    out = e.outs[0]
    axis = int(e.params["axis"])
    if out.size == 1:
        cg.new_scalar(out, "stack", cg.s_at(e.ins[0], "0"))
        return
    name = cg.new_array(out, "stack")
    ostr = _strides(out.shape)
    for k, x in enumerate(e.ins):
        cg.loop(x.shape, lambda idx, k=k, x=x: (
            f"{name}[{_flat([*idx[:axis], str(k), *idx[axis:]], out.shape, ostr)}] = "
            f"{cg.s_at(x, _flat(idx, x.shape))};"))


@_translates("unstack")
def _p_unstack(cg: _Codegen, e: _Eqn) -> None:
    (a,) = e.ins
    axis = int(e.params["axis"])
    astr = _strides(a.shape)
    for k, out in enumerate(e.outs):
        cg.copy_indexed(out, "unstack", lambda idx, k=k: _flat(
            [*idx[:axis], str(k), *idx[axis:]], a.shape, astr), a)

# -- indexing by integers: data, or constants ----------------------------------------------
def _index(cg: _Codegen, v: _Val, idx: str, e: _Eqn) -> str:
    """An integer index of ``e`` read from the data or a constant (never from w)."""
    r = cg.ref(v)
    if r.is_s:
        raise _refusal(e.prim, e.where, f"'{e.prim}' with indices computed from w at "
                       f"{e.where}", "an index computed from w has no derivative: "
                       "compute it from the data (data-only computations may use any "
                       "primitive)")
    x = cg.at(v, idx)
    return x if r.is_int else f"int({x})"


def _start(var: str, raw: str, top: int) -> str:
    """Statements: ``var`` = raw clamped into [0, top] (XLA's dynamic_slice and gather)."""
    return (f"int {var} = {raw}; if ({var} < 0) {var} = 0; if ({var} > {top}) "
            f"{var} = {top};")


def _mode(e: _Eqn) -> str:
    mode = str(e.params.get("mode", "")).rsplit(".", 1)[-1].upper()
    if e.params.get("dimension_numbers") is not None and tuple(getattr(
            e.params["dimension_numbers"], "operand_batching_dims", ())):
        raise _refusal(e.prim, e.where, f"'{e.prim}' with batching dimensions at {e.where}")
    return mode


@_translates("gather")
def _p_gather(cg: _Codegen, e: _Eqn) -> None:
    """XLA's gather: out-of-range starts clamped (clip, promise_in_bounds) or filled."""
    op, ind = e.ins
    out = e.outs[0]
    dn = e.params["dimension_numbers"]
    mode = _mode(e)
    offset_dims, collapsed = tuple(dn.offset_dims), tuple(dn.collapsed_slice_dims)
    smap, sizes = tuple(dn.start_index_map), tuple(e.params["slice_sizes"])
    batch_pos = [d for d in range(len(out.shape)) if d not in offset_dims]
    window = [d for d in range(len(op.shape)) if d not in collapsed]
    fill = e.params.get("fill_value")
    fill = _real_literal(float("nan") if fill is None else fill)
    pre = cg.fresh("s")

    def body(idx):
        lines, ok = [], []
        bidx = [idx[d] for d in batch_pos]
        for k, d in enumerate(smap):
            raw = _index(cg, ind, _flat([*bidx, str(k)], ind.shape), e)
            top = op.shape[d] - sizes[d]
            if mode == "FILL_OR_DROP":
                lines.append(f"const int {pre}_{k} = {raw};")
                ok.append(f"{pre}_{k} >= 0 && {pre}_{k} <= {top}")
            else:
                lines.append(_start(f"{pre}_{k}", raw, top))
        value = cg.s_at(op, _window_offset(op.shape, smap, pre, window, offset_dims, idx))
        if ok:
            value = f"({' && '.join(ok)}) ? {value} : S({fill})"
        return lines, value

    if out.size == 1:
        lines, value = body(["0"] * len(out.shape))
        for line in lines:
            cg.emit(line)
        cg.new_scalar(out, "gather", value)
        return
    name = cg.new_array(out, "gather")
    def statement(idx):
        lines, value = body(idx)
        return "{ " + " ".join(lines) + f" {name}[{_flat(idx, out.shape)}] = {value}; }}"
    cg.loop(out.shape, statement)


@_translates("scatter-add")
def _p_scatter_add(cg: _Codegen, e: _Eqn) -> None:
    """XLA's scatter-add (the gradient of gather): out-of-range updates dropped, or
    clamped in clip mode."""
    op, ind, upd = e.ins
    out = e.outs[0]
    dn = e.params["dimension_numbers"]
    mode = _mode(e)
    uwin, inserted = tuple(dn.update_window_dims), tuple(dn.inserted_window_dims)
    smap = tuple(dn.scatter_dims_to_operand_dims)
    scatter_pos = [d for d in range(len(upd.shape)) if d not in uwin]
    window = [d for d in range(len(out.shape)) if d not in inserted]
    name = cg.new_array(out, "scatter_add")
    cg.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {cg.s_at(op, 'i')};")
    pre = cg.fresh("s")

    def body(idx):
        lines, ok = [], []
        sidx = [idx[d] for d in scatter_pos]
        wsize = {d: upd.shape[uwin[window.index(d)]] if d in window else 1
                 for d in range(len(out.shape))}
        for k, d in enumerate(smap):
            raw = _index(cg, ind, _flat([*sidx, str(k)], ind.shape), e)
            top = out.shape[d] - wsize[d]
            if mode == "CLIP":
                lines.append(_start(f"{pre}_{k}", raw, top))
            else:
                lines.append(f"const int {pre}_{k} = {raw};")
                ok.append(f"{pre}_{k} >= 0 && {pre}_{k} <= {top}")
        value = cg.s_at(upd, _flat(idx, upd.shape))
        target = (f"{name}[{_window_offset(out.shape, smap, pre, window, uwin, idx)}] += "
                  f"{value};")
        if ok:
            target = f"if ({' && '.join(ok)}) {target}"
        return "{ " + " ".join(lines) + " " + target + " }"
    cg.loop(upd.shape, body)


def _starts(cg: _Codegen, e: _Eqn, op_shape, sizes, index_vals) -> list[str]:
    """dynamic_slice's starts: one integer each, clamped as XLA does, as variables."""
    out = []
    for k, (v, n, m) in enumerate(zip(index_vals, op_shape, sizes)):
        var = cg.fresh(f"start{k}")
        cg.emit(_start(var, _index(cg, v, "0", e), n - m))
        out.append(var)
    return out


@_translates("dynamic_slice")
def _p_dynamic_slice(cg: _Codegen, e: _Eqn) -> None:
    op, *index_vals = e.ins
    out = e.outs[0]
    starts = _starts(cg, e, op.shape, out.shape, index_vals)
    astr = _strides(op.shape)
    cg.copy_indexed(out, "dynamic_slice", lambda idx: _flat(
        [f"({s} + {i})" if i != "0" else s for s, i in zip(starts, idx)], op.shape, astr),
        op)


@_translates("dynamic_update_slice")
def _p_dynamic_update_slice(cg: _Codegen, e: _Eqn) -> None:
    op, upd, *index_vals = e.ins
    out = e.outs[0]
    starts = _starts(cg, e, op.shape, upd.shape, index_vals)
    name = cg.new_array(out, "dynamic_update_slice")
    cg.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {cg.s_at(op, 'i')};")
    def at(idx):
        return _flat([f"({s} + {i})" if i != "0" else s for s, i in zip(starts, idx)],
                     out.shape)
    cg.loop(upd.shape, lambda idx: (
        f"{name}[{at(idx)}] = {cg.s_at(upd, _flat(idx, upd.shape))};"))


def _reduce(cg: _Codegen, e: _Eqn, kind: str) -> None:
    (a,) = e.ins
    out = e.outs[0]
    axes = tuple(int(x) for x in e.params["axes"])
    count = int(np.prod([a.shape[k] for k in axes], dtype=np.int64))
    keep = [k for k in range(len(a.shape)) if k not in axes]
    if cg.is_scalar(a):
        expr = cg.s_at(a, "0")
        if kind == "sum":
            expr = f"{expr} * Real({count})"
        cg.new_scalar(out, "reduce_" + kind, expr)
        return
    if kind == "sum":
        init, update = "S(Real(0))", lambda o, x: f"{o} += {x};"
    else:
        op = ">" if kind == "max" else "<"
        init = f"S(Real({'-' if kind == 'max' else ''}HUGE_VAL))"
        update = lambda o, x: f"{o} = select(value_of({x}) {op} value_of({o}), {x}, {o});"  # noqa: E731
    if out.size == 1:
        name = cg.new_scalar(out, "reduce_" + kind, init, const=False)
        cg.emit(f"for (int i = 0; i < {a.size}; ++i) {update(name, cg.at(a, 'i'))}")
        return
    name = cg.new_array(out, "reduce_" + kind)
    ostr = _strides(out.shape)
    cg.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = {init};")
    cg.loop(a.shape, lambda idx: update(
        f"{name}[{_flat([idx[k] for k in keep], out.shape, ostr)}]",
        cg.at(a, _flat(idx, a.shape))))


@_translates("reduce_sum")
def _p_reduce_sum(cg: _Codegen, e: _Eqn) -> None:
    _reduce(cg, e, "sum")


@_translates("reduce_max")
def _p_reduce_max(cg: _Codegen, e: _Eqn) -> None:
    _reduce(cg, e, "max")


@_translates("reduce_min")
def _p_reduce_min(cg: _Codegen, e: _Eqn) -> None:
    _reduce(cg, e, "min")


@_translates("cumsum")
def _p_cumsum(cg: _Codegen, e: _Eqn) -> None:
    """A running sum along ``axis`` (from the end when ``reverse``, as in its gradient): one
    accumulator walks each line of the axis. (cummax, cummin, cumprod and cumlogsumexp
    reach the jaxpr of a gradient as JAX's associative scans: slices, pads, max, mul.)"""
    (a,) = e.ins
    out = e.outs[0]
    axis, reverse = int(e.params["axis"]), bool(e.params["reverse"])
    n = out.shape[axis]
    if n == 1:
        cg.alias(out, a)
        return
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    outer = int(np.prod(out.shape[:axis], dtype=np.int64))
    name = cg.new_array(out, e.prim)
    base = " + ".join(t for t in (f"o * {n * inner}" if outer > 1 else "",
                                  "i" if inner > 1 else "") if t) or "0"
    if outer > 1:
        cg.emit(f"for (int o = 0; o < {outer}; ++o)")
    if inner > 1:
        cg.emit(f"for (int i = 0; i < {inner}; ++i)")
    first = f"{base} + {(n - 1) * inner}" if reverse else base
    k = f"({n - 1} - k)" if reverse else "k"
    at = f"{base} + {k}" + (f" * {inner}" if inner > 1 else "")
    cg.emit(f"{{ S acc = {cg.s_at(a, first)}; {name}[{first}] = acc;")
    cg.emit(f"  for (int k = 1; k < {n}; ++k) {{ const int at = {at}; acc += "
            f"{cg.s_at(a, 'at')}; {name}[at] = acc; }} }}")


@_translates("sort")
def _p_sort(cg: _Codegen, e: _Eqn) -> None:
    """A value that depends on w in the order of a sort of the data (``order=True``: the
    walk split the sort, :meth:`._jaxpr._Program._sort_by_data`); a sort whose keys depend
    on w is refused."""
    if not e.params.get("order"):
        raise _refusal(e.prim, e.where, f"'sort' at {e.where} orders values that depend on w "
                       "(the order itself would change with w); a sort whose keys are data "
                       "compiles")
    x, order = e.ins
    out = e.outs[0]
    dim = int(e.params["dimension"])
    if out.shape[dim] == 1:
        cg.alias(out, x)
        return
    strides = _strides(out.shape)
    cg.copy_indexed(out, "sort", lambda idx: _flat(
        [_index(cg, order, _flat(idx, out.shape), e) if d == dim else i
         for d, i in enumerate(idx)], out.shape, strides), x)


@_translates("conv_general_dilated")
def _p_conv_general_dilated(cg: _Codegen, e: _Eqn) -> None:
    """XLA's convolution as loops: out[n, o, y] = sum over the input features of o's group
    and the kernel's window of lhs[n', f, x] rhs[o, i, k], x_d = (y_d stride_d + k_d
    rhs_dilation_d - pad_lo_d) / lhs_dilation_d where that is a whole index inside the
    input (padding, dilations and strides of both directions: the gradients' convolutions
    too; feature and batch groups)."""
    lhs, rhs = e.ins
    out = e.outs[0]
    prm = e.params
    lspec, rspec, ospec = (tuple(int(d) for d in s) for s in prm["dimension_numbers"])
    nsp = len(lspec) - 2
    ldil = tuple(prm["lhs_dilation"] or (1,) * nsp)
    rdil = tuple(prm["rhs_dilation"] or (1,) * nsp)
    stride = tuple(prm["window_strides"])
    pads = [tuple(int(v) for v in p) for p in prm["padding"]]
    groups, batches = int(prm["feature_group_count"]), int(prm["batch_group_count"])
    n_out, n_o, n_i = out.shape[ospec[0]], rhs.shape[rspec[0]], rhs.shape[rspec[1]]
    size_in = [lhs.shape[lspec[2 + d]] for d in range(nsp)]
    size_k = [rhs.shape[rspec[2 + d]] for d in range(nsp)]
    size_out = [out.shape[ospec[2 + d]] for d in range(nsp)]
    name = cg.new_array(out, "conv")
    li, ri, oi = ["0"] * len(lhs.shape), ["0"] * len(rhs.shape), ["0"] * len(out.shape)
    li[lspec[0]] = "n" if batches == 1 else f"(bat * {n_out} + n)"
    li[lspec[1]] = "i" if groups == 1 else f"(grp * {n_i} + i)"
    ri[rspec[0]], ri[rspec[1]], oi[ospec[0]], oi[ospec[1]] = "o", "i", "n", "o"
    lines = [f"for (int n = 0; n < {n_out}; ++n)", f"for (int o = 0; o < {n_o}; ++o) {{"]
    if groups > 1:
        lines.append(f"  const int grp = o / {n_o // groups};")
    if batches > 1:
        lines.append(f"  const int bat = o / {n_o // batches};")
    for d in range(nsp):
        lines.append(f"  for (int y{d} = 0; y{d} < {size_out[d]}; ++y{d})")
        oi[ospec[2 + d]] = f"y{d}"
    lines += ["  {", "    S acc = S(Real(0));", f"    for (int i = 0; i < {n_i}; ++i)"]
    for d in range(nsp):
        span = (size_in[d] - 1) * ldil[d] + 1  # the dilated input's extent
        pos = " + ".join(t for t in (f"y{d} * {stride[d]}" if stride[d] != 1 else f"y{d}",
                                     f"k{d} * {rdil[d]}" if rdil[d] != 1 else f"k{d}",
                                     str(-pads[d][0]) if pads[d][0] else "") if t)
        off = f"p{d} % {ldil[d]} != 0 || " if ldil[d] != 1 else ""
        lines += [f"    for (int k{d} = 0; k{d} < {size_k[d]}; ++k{d}) {{",
                  f"      const int p{d} = {pos};",
                  f"      if ({off}p{d} < 0 || p{d} >= {span}) continue;",
                  f"      const int x{d} = p{d}" + (f" / {ldil[d]};" if ldil[d] != 1 else ";")]
        li[lspec[2 + d]], ri[rspec[2 + d]] = f"x{d}", f"k{d}"
    lines.append(f"      acc += {cg.at(lhs, _flat(li, lhs.shape))} * "
                 f"{cg.at(rhs, _flat(ri, rhs.shape))};")
    lines += ["    " + "}" * nsp, f"    {name}[{_flat(oi, out.shape)}] = acc;", "  }", "}"]
    cg.emit("{")
    for line in lines:
        cg.emit("  " + line)
    cg.emit("}")


@_translates("dot_general")
def _p_dot_general(cg: _Codegen, e: _Eqn) -> None:
    lhs, rhs = e.ins
    out = e.outs[0]
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    if not lb and _dense(cg, e, lhs, rhs, lc, rc, lf, rf, out):
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
        return (cg.at(lhs, _flat(li, lhs.shape, ls)), cg.at(rhs, _flat(ri, rhs.shape, rs)))

    kcount = int(np.prod(K, dtype=np.int64))
    if kcount == 1:
        def prod(oidx):
            a, b = operands(oidx, ["0"] * len(K))
            return f"{a} * {b}"
        if out.size == 1:
            cg.new_scalar(out, "dot_general", prod(["0"] * len(out.shape)))
        else:
            name = cg.new_array(out, "dot_general")
            cg.loop(out.shape, lambda o: f"{name}[{_flat(o, out.shape)}] = {prod(o)};")
        return
    # acc = sum_k; one accumulator per output element
    kvars = [f"k{n}" if K[n] != 1 else "0" for n in range(len(K))]

    def body(oidx, target):
        a, b = operands(oidx, kvars)
        loops = "".join(f"for (int {v} = 0; {v} < {n}; ++{v}) " for v, n in zip(kvars, K)
                        if v != "0")
        return f"{loops}{target} += {a} * {b};"
    if out.size == 1:
        name = cg.new_scalar(out, "dot_general", "S(Real(0))", const=False)
        cg.emit(body(["0"] * len(out.shape), name))
        return
    name = cg.new_array(out, "dot_general")
    cg.emit(f"for (int i = 0; i < {out.size}; ++i) {name}[i] = S(Real(0));")
    cg.loop(out.shape, lambda o: body(o, f"{name}[{_flat(o, out.shape)}]"), pre="o")


def _dense(cg: _Codegen, e: _Eqn, lhs, rhs, lc, rc, lf, rf, out) -> bool:
    """Data (Real array field) times w-dependent array through matvec_rows / matvec_cols."""
    rl, rr = cg.ref(lhs), cg.ref(rhs)
    if not rl.is_s and rr.is_s:
        D, Dc, Df, Sv, Sc, Sf, data_lhs = lhs, lc, lf, rhs, rc, rf, True
    elif rl.is_s and not rr.is_s:
        D, Dc, Df, Sv, Sc, Sf, data_lhs = rhs, rc, rf, lhs, lc, lf, False
    else:
        return False
    rd, rsv = cg.ref(D), cg.ref(Sv)
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
    name = cg.new_array(out, "dot_general")
    # out is (M, N) when the data are lhs, (N, M) when they are rhs
    contiguous_o = (not data_lhs) or N == 1
    s_vec = None if contiguous_s else cg.temp(K, "column")
    o_vec = None if contiguous_o else cg.temp(M, "product")
    dptr = rd.name
    cg.emit(f"for (int n = 0; n < {N}; ++n) {{" if N > 1 else "{")
    nvar = "n" if N > 1 else "0"
    if contiguous_s:
        terms = [t for t in (rsv.name, str(rsv.offset) if rsv.offset else "",
                             f"n * {K}" if N > 1 else "") if t]
        sp = " + ".join(terms)
    else:
        gather = " + ".join(t for t in (
            _unravel(nvar, [Sv.shape[d] for d in Sf], [ss[d] for d in Sf]) if N > 1 else "0",
            _unravel("k", [Sv.shape[d] for d in Sc], [ss[d] for d in Sc])) if t != "0") or "0"
        cg.emit(f"  for (int k = 0; k < {K}; ++k) {s_vec}[k] = {cg.at(Sv, gather)};")
        sp = s_vec
    if contiguous_o:
        op = name if (data_lhs or N == 1) else f"{name} + n * {M}"
    else:
        op = o_vec
    if form == "rows":
        cg.emit(f"  matvec_rows({dptr}, {M}, {K}, {sp}, {op});")
    else:
        cg.emit(f"  matvec_cols({dptr}, {K}, {M}, {sp}, {op});")
    if not contiguous_o:
        cg.emit(f"  for (int m = 0; m < {M}; ++m) {name}[m * {N} + n] = {o_vec}[m];")
    cg.emit("}")
    return True


#: Primitives translated on values that depend on w (data-only equations may use any
#: primitive: JAX evaluates them). Calls (jit/pjit, closed_call, custom_jvp_call,
#: custom_vjp_call, remat) are inlined.
SUPPORTED = tuple(TABLE)
