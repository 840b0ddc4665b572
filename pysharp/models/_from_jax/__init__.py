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

The package: ``_jaxpr`` (the traced program), ``_codegen`` (C++ text, names, the work
buffer), ``_primitives`` (the primitive translation table and its refusals), ``_header``
(the pipeline and the header around the statements); here, the public API.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._check import check as run_check
from .._compiler import cache_dir, write_private
from .._groups import group_bounds
from .._loaded import LoadedModel, _dtype_name, check_real_data, fields_from_files
from ._header import _trace
from ._jaxpr import _as_jax, _static, _suspects
from ._primitives import _UNTRACED, SUPPORTED, UnsupportedPrimitive


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


__all__ = ["from_jax", "from_jax_file", "JaxModel", "UnsupportedPrimitive", "SUPPORTED"]
