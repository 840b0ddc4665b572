"""The generated header: ``jax.value_and_grad(loss)`` traced, translated and assembled.

:func:`_trace` runs the pipeline: the jaxpr (:mod:`._jaxpr`), the equations that depend
on w translated by the primitive table (:mod:`._primitives`) through the codegen
(:mod:`._codegen`), the data-only ones evaluated by JAX now and bound as fields, and the
header of the documented form (``pysharp/model.hpp``) around the statements.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._check import _jax_x64
from .._groups import equal_blocks
from ._codegen import _Codegen
from ._jaxpr import _as_jax, _Program, _static, _Val
from ._primitives import TABLE, _refusal

#: A loss_grad of more lines than this is compiled as stages of about this many lines, each
#: a function of its own that is never inlined: the compiler's work on one function grows
#: faster than its length, and in a long one it stops inlining the jets' arithmetic (an
#: unrolled RNN of 948 equations: 62 s of compiler time whole, 51 s in stages; a loss of
#: 225 equations ran its D^3L 8x faster staged: bench/results/from_jax.json).
_STAGE_LINES = 300

#: Where a scalar is defined at the top level of loss_grad, and an array's pointer.
_SCALAR_DEF = re.compile(r"^    (?:const )?S (\w+) = ")
_POINTER_DEF = re.compile(r"^    S\* const (\w+) = ")
_NAME = re.compile(r"[A-Za-z_]\w*")


def _stages(cg: _Codegen, lines: list[str], top: int) -> tuple[list[str], list[str], int]:
    """loss_grad's statements cut at equations into stages of about _STAGE_LINES lines:
    (the stages' member functions, loss_grad's statements calling them, the work size).

    A stage re-declares the pointers of the arrays it reads from earlier stages (the arrays
    are in ``work``); a scalar that a later stage reads is stored in a slot of ``work``
    after ``top`` at the end of its stage and read from it. Stages are never inlined, so
    the compiler optimises each alone."""
    cuts, size = [], 0
    for a, b in zip(cg.starts, cg.starts[1:]):
        size += b - a
        if size >= _STAGE_LINES:
            cuts.append(b)
            size = 0
    if not cuts or cuts[-1] == cg.starts[-1]:
        cuts = cuts[:-1]
    if not cuts:
        return [], lines, top
    bounds = [0, *cuts, cg.starts[-1], len(lines)]
    parts = [lines[a:b] for a, b in zip(bounds, bounds[1:])]  # the stages, then the outputs
    home: dict[str, int] = {}
    pointer: dict[str, str] = {}
    slots: dict[str, int] = {}
    imports: list[list[str]] = []
    exports: list[list[str]] = [[] for _ in parts]
    for k, part in enumerate(parts):
        defined, head = set(), []
        for line in part:
            for name in _NAME.findall(line.split("//", 1)[0]):
                if name in defined or name in head:
                    continue
                if name in pointer:
                    head.append(name)
                elif name in home and home[name] < k:
                    if name not in slots:
                        slots[name] = top + len(slots)
                        exports[home[name]].append(f"    work[{slots[name]}] = {name};")
                    head.append(name)
            m = _SCALAR_DEF.match(line) or _POINTER_DEF.match(line)
            if m:
                defined.add(m.group(1))
                if _POINTER_DEF.match(line):
                    pointer[m.group(1)] = line
                else:
                    home[m.group(1)] = k
        imports.append([pointer[n] if n in pointer else f"    const S {n} = work[{slots[n]}];"
                        for n in head])
    members, calls = [], []
    for k, part in enumerate(parts[:-1]):
        name = cg.fresh("loss_grad_stage")
        members += ["", "  template <class S>",
                    f"  PYSHARP_JAX_STAGE PYSHARP_HD void {name}(const S* w, S* g, S* work) "
                    "const {", "    (void)w;", "    (void)g;", "    (void)work;",
                    *imports[k], *part, *exports[k], "  }"]
        calls.append(f"    {name}(w, g, work);")
    return members, [*calls, *imports[-1], *parts[-1]], top + len(slots)


def _header(cg: _Codegen, loss_name: str, where: str, w_shape, inputs, groups) -> str:
    """The header's text around ``cg``'s statements, its buffers placed in ``work``."""
    import jax
    work = cg.allocate()
    lines = list(cg.lines)
    for buf in cg.buffers:
        target = "g" if buf.in_g else ("work" if buf.offset == 0 else f"work + {buf.offset}")
        lines = [line.replace(buf.token, target) for line in lines]
    stages, lines, work = _stages(cg, lines, work) if len(lines) > _STAGE_LINES else \
        ([], lines, work)
    body = "\n".join(lines)
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
        *(f"using pysharp::{f};" for f in sorted(cg.functions)),
        *(["#ifndef PYSHARP_JAX_STAGE  // a stage of a long loss_grad: a function of its own",
           "#ifdef __CUDACC__", "#define PYSHARP_JAX_STAGE __noinline__", "#else",
           "#define PYSHARP_JAX_STAGE __attribute__((noinline))", "#endif", "#endif"]
          if stages else []),
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
    lines += [body, "    return pysharp::is_finite(value_of(*loss));", "  }", *stages, "};",
              f"PYSHARP_MODEL({cg.struct}{''.join(', ' + d for d in decls)})", ""]
    return "\n".join(lines)


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
    """``jax.value_and_grad(loss)`` at the flat float64 ``w`` and ``data`` as a header's
    text and the values of its fields (nothing is compiled here); ``groups`` the block
    bounds (``group_bounds``), or None."""
    import jax
    import jax.numpy as jnp

    arrays = {k: v for k, v in data.items() if not _static(v)}
    static = {k: v for k, v in data.items() if _static(v)}
    shape = w.shape

    def value_and_grad(wf, arrs):
        f = lambda x: loss(x.reshape(shape), **arrs, **static)  # noqa: E731
        return jax.value_and_grad(f)(wf)

    with _jax_x64(jax):
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
        cg = _Codegen(prog, w_val, int(wf.shape[0]), _struct_name(loss), TABLE)
        cg.plan()
        bad = [e for e in cg.code if e.prim not in TABLE]
        if bad:
            raise _refusal(bad[0].prim, bad[0].where)
        # Data-only equations: evaluated by JAX, now.
        env: dict[int, Any] = {id(v): traced[v.input_name] for v in data_vals}

        def read(x):
            if x.const is not None:
                return x.const
            return env[id(x)]
        for e in cg.fold:
            for o, r in zip(e.outs, e.evaluate(*[read(x) for x in e.ins])):
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
