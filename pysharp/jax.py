"""pysharp's exact kernels as JAX functions: jit, vmap and grad work through them.

::

    import jax, jax.numpy as jnp
    import pysharp as ps
    import pysharp.jax as psj

    model = ps.BNLinearRegression.synthetic(d=40, n=20)
    w = jnp.asarray(model.random_point(8))            # (B, D)
    L = psj.loss(model, w)                            # (B,)
    g = jax.grad(lambda w: psj.loss(model, w).sum())(w)   # calls the gradient kernel
    H = jax.hessian(lambda w: psj.loss(model, w))(w[0])   # (D, D), D HVP kernel calls

Functions (``model`` is any :class:`pysharp.ScaleInvariantModel`, built-in or
loaded with :func:`pysharp.load_model`; ``w`` and ``v`` are (D,) or (B, D)):

- :func:`loss` -- L(w), shape () or (B,). Differentiable to any order that
  forward mode reaches: its JVP is ``<grad L(w), t>`` from the gradient kernel,
  the gradient's JVP is the HVP kernel, the HVP's JVP is the third-order
  kernel. So ``jax.grad`` calls the gradient kernel and ``jax.hessian``
  (forward over reverse) the HVP kernel; a ``jax.jvp`` of ``jax.grad`` is one
  HVP kernel call.
- :func:`loss_and_grad` -- (L, grad L), with the JVP above for both outputs.
- :func:`hvp` -- H(w) v; its JVP in v is ``H(w) tv`` and in w
  ``D^3L(w)[v, tw]``, from the third-order kernel by polarization
  (``D^3L[v, t] = (T(v + s t) - T(v - s t)) / (4 s)`` with ``T(u) = D^3L[u, u]``
  and ``s = |v| / |t|``).
- :func:`third` -- D^3L(w)[v, v]; differentiable in v (``2 D^3L[v, tv]``), not in w
  (that would need the fourth derivative: NotImplementedError).
- :func:`hessian` -- the dense Hessian, (D, D) or (B, D, D); not differentiable.

How it runs: by default each kernel is a ``jax.ffi`` target. The first use of a
model compiles its XLA FFI handlers (``cpu/jax_ffi.hpp``, against jaxlib's FFI
headers, with the core's compiler and flags; seconds, then cached on disk like a
loaded model, per model type and dtype) and registers them with XLA; a call then
runs the core's kernel on XLA's buffers with no Python in between, reading the
model through the address of its compiled view (kept alive with the model). Under
``jax.vmap`` a call receives the whole batch (``vmap_method="broadcast_all"``: the
kernels take (B, D) batches and run them in parallel), never one point per call.
Where the handlers cannot be built (no C++ compiler), a warning says so and the
kernels run through a Python callback instead: a small primitive of this module
lowered with XLA's Python CPU callback, on XLA's buffers without the per-call
copy ``jax.pure_callback`` makes (it relies on JAX internals), else
``jax.pure_callback`` itself. ``PYSHARP_JAX_CALLBACK=direct`` or
``pure_callback`` picks those paths; ``CALLBACK_PATH`` says which is asked for.
:func:`hessian` always goes through the callback. Arrays on a GPU are not
supported yet (the GPU variants come with the GPU issue).

Not supported: reverse mode over reverse mode (``jax.grad`` of a function of
``jax.grad``: the HVP callback has no transpose rule; use ``jax.jvp`` over
``jax.grad``, i.e. forward over reverse, as ``jax.hessian`` does), and
``jax.vjp`` of :func:`hvp` itself for the same reason.

dtypes: float64 (enable it with ``jax.config.update("jax_enable_x64", True)``)
and float32 run in that precision; integer inputs become JAX's default float
type; float16/bfloat16 are refused (TypeError) rather than silently widened.
Errors the model raises (a zero w, an undefined loss) surface inside JAX as
its callback error carrying pysharp's message.

The model object is captured by the traced functions (it is static: it is not
an array and never a jit argument; ``jax.jit(f, static_argnums=0)`` with a model as
argument works too, models hash by identity).
"""

from __future__ import annotations

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
except ImportError as exc:  # pragma: no cover - exercised without JAX installed
    raise ImportError("pysharp.jax needs JAX, which is not installed: `pip install jax` "
                      "(CPU) or see https://docs.jax.dev/en/latest/installation.html") from exc

import os
import warnings
import weakref

import numpy as np

from .models import ScaleInvariantModel
from .models._compiler import ModelCompileError, compile_jax_ffi

__all__ = ["loss", "loss_and_grad", "hvp", "third", "hessian"]


def _direct_callback():
    """A primitive whose CPU lowering is XLA's Python callback with NumPy arguments.

    ``jax.pure_callback`` first ``device_put``-s every argument (a copy of the
    whole (B, D) batch per call, about half of its cost at B = 4096) and then
    hands the callback jax Arrays. This primitive lowers with the same emitter
    (``jax._src.callback.emit_python_callback``) but passes XLA's host buffers
    straight to the callback as read-only NumPy arrays, and batches like
    ``pure_callback(..., vmap_method="broadcast_all")`` (``ffi_batching_rule``).
    It uses JAX internals, so it is built only when they are found; otherwise
    (None) the functions use ``jax.pure_callback``.
    """
    try:
        import functools

        from jax._src import callback as jcb
        from jax._src import dispatch
        from jax._src import ffi as jffi
        from jax._src.interpreters import batching, mlir
        from jax.extend.core import Primitive
        jcb.emit_python_callback, jffi.ffi_batching_rule  # noqa: B018 - the internals used
    except (ImportError, AttributeError):  # pragma: no cover - other JAX versions
        return None
    prim = Primitive("pysharp_kernel")
    prim.multiple_results = True
    prim.def_abstract_eval(lambda *avals, callback, result_avals, vmap_method: result_avals)
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))

    def lowering(ctx, *args, callback, result_avals, vmap_method):
        result, _, _ = jcb.emit_python_callback(
            ctx, callback, None, list(args), ctx.avals_in, ctx.avals_out,
            has_side_effect=False, returns_token=False)
        return result

    mlir.register_lowering(prim, lowering, platform="cpu", cacheable=False)
    batching.primitive_batchers[prim] = functools.partial(jffi.ffi_batching_rule, prim)
    return prim


_PATHS = ("ffi", "direct", "pure_callback")


def _default_path() -> str:
    path = os.environ.get("PYSHARP_JAX_CALLBACK", "ffi")
    if path not in _PATHS:
        raise ValueError(f"PYSHARP_JAX_CALLBACK must be one of {', '.join(_PATHS)}, got {path!r}")
    return path


_PRIM = _direct_callback()
#: How the kernels are called from JAX, unless a model's handlers cannot be compiled (then
#: "direct", with a warning): "ffi" (XLA FFI handlers compiled for the model, no Python in
#: the call), "direct" (a Python callback on XLA's buffers) or "pure_callback"
#: (``jax.pure_callback``). ``PYSHARP_JAX_CALLBACK`` picks another.
CALLBACK_PATH = _default_path()
if CALLBACK_PATH == "direct" and _PRIM is None:  # pragma: no cover - other JAX versions
    CALLBACK_PATH = "pure_callback"


def _callback(fn, shapes, *args, path: str = "direct"):
    """fn(*numpy args) -> tuple of arrays of ``shapes`` ((shape, dtype) pairs), batched over
    vmap by passing the whole batch (broadcast_all)."""
    if _PRIM is not None and path == "direct":
        avals = tuple(jax.core.ShapedArray(s, d) for s, d in shapes)
        return tuple(_PRIM.bind(*args, callback=fn, result_avals=avals,
                                vmap_method="broadcast_all"))
    out = tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes)
    return jax.pure_callback(fn, out, *args, vmap_method="broadcast_all")

_KERNEL_DTYPES = (jnp.dtype(jnp.float64), jnp.dtype(jnp.float32))


def _host_call(ref, kernel: str):
    """The NumPy function a pure_callback runs: reshape any leading axes to one batch."""

    def call(*arrays):
        model = ref()
        if model is None:  # pragma: no cover - the traced function outlived its model
            raise RuntimeError("the pysharp model of this traced function was garbage collected")
        arrays = [np.asarray(a) for a in arrays]
        lead = np.broadcast_shapes(*(a.shape[:-1] for a in arrays))
        D = model.dim
        flat = [np.broadcast_to(a, lead + (D,)).reshape(-1, D) for a in arrays]
        outs = getattr(model, kernel)(*flat)
        if kernel == "loss_and_grad":
            L, G = outs
            return np.asarray(L).reshape(lead), G.reshape(lead + (D,))
        if kernel == "hessian":
            return (outs.reshape(lead + (D, D)),)
        return (outs.reshape(lead + (D,)),)

    return call


_REGISTERED: dict[str, dict[str, str]] = {}  # FFI module name -> {kernel: target name}


def _ffi_targets(model, dtype) -> dict[str, str]:
    """The FFI targets of ``model``'s kernels in ``dtype``, compiled (once, cached on disk)
    and registered with XLA (once per process)."""
    header, name, include_dirs = model._declaration()
    module = compile_jax_ffi(header, name, np.dtype(dtype).name, include_dirs)
    key = module.__name__
    if key not in _REGISTERED:
        targets = {}
        for kernel, capsule in module.HANDLERS.items():
            targets[kernel] = f"{key}_{kernel}"
            jax.ffi.register_ffi_target(targets[kernel], capsule, platform="cpu")
        _REGISTERED[key] = targets
    return _REGISTERED[key]


class _FFIKernels:
    """A model's kernels as ``jax.ffi`` calls: per dtype, the registered targets and the
    address of the model's C++ view, whose holder this object keeps alive. The handlers of
    a dtype are compiled when a call in it is first traced; where they cannot be built (no
    compiler, a model without a header), ``failed`` is set, with a warning, and the caller
    falls back to the Python callback."""

    def __init__(self, model) -> None:
        self._model = weakref.ref(model)
        self._targets: dict = {}
        self._cores: dict = {}  # strong references: the handlers read these objects
        self.failed = False

    def ready(self, dtype) -> bool:
        """Whether the handlers of ``dtype`` are registered (building them on first use)."""
        dtype = np.dtype(dtype)
        if not self.failed and dtype not in self._targets:
            model = self._model()
            try:
                self._targets[dtype] = _ffi_targets(model, dtype)
            except (ModelCompileError, NotImplementedError, OSError) as exc:
                warnings.warn(f"pysharp.jax: no FFI handlers for {type(model).__name__} "
                              f"({exc}); calling its kernels through a Python callback "
                              "instead", stacklevel=2)
                self.failed = True
                return False
            self._cores[dtype] = model._core(dtype)
        return not self.failed

    def __call__(self, kernel: str, shapes, *args):
        dtype = np.dtype(args[0].dtype)
        out = tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes)
        call = jax.ffi.ffi_call(self._targets[dtype][kernel], out, vmap_method="broadcast_all")
        return tuple(call(*args, model=np.uint64(self._cores[dtype].model_address)))


class _Ops:
    """The custom_jvp functions of one model, built once (see :func:`_ops`)."""

    def __init__(self, model, path: str) -> None:
        ref = weakref.ref(model)
        self.dim = model.dim
        self.requested = path
        # The callback path: the one asked for, or "direct" where the FFI handlers fail.
        self._callback_path = "pure_callback" if path == "pure_callback" else "direct"
        self._ffi = ffi = _FFIKernels(model) if path == "ffi" else None
        cb = {k: _host_call(ref, k) for k in ("loss_and_grad", "hvp", "third", "hessian")}

        def lg_raw(w):
            shapes = ((w.shape[:-1], w.dtype), (w.shape, w.dtype))
            if ffi is not None and ffi.ready(w.dtype):
                return ffi("loss_and_grad", shapes, w)
            return _callback(cb["loss_and_grad"], shapes, w, path=self._callback_path)

        def pair_raw(kernel, w, v):
            shape = jnp.broadcast_shapes(w.shape, v.shape)
            if ffi is not None and ffi.ready(w.dtype):
                w, v = jnp.broadcast_to(w, shape), jnp.broadcast_to(v, shape)
                return ffi(kernel, ((shape, w.dtype),), w, v)[0]
            return _callback(cb[kernel], ((shape, w.dtype),), w, v, path=self._callback_path)[0]

        def hessian_raw(w):  # a Python callback on every path: not for inner loops
            shape = w.shape + (w.shape[-1],)
            return _callback(cb["hessian"], ((shape, w.dtype),), w, path=self._callback_path)[0]

        def zero(t):
            return isinstance(t, SymbolicZero)

        @jax.custom_jvp
        def third(w, v):
            return pair_raw("third", w, v)

        def polar(w, v, t):
            """D^3L(w)[v, t] from two third-order kernel calls, norms balanced."""
            nv = jnp.linalg.norm(v, axis=-1, keepdims=True)
            nt = jnp.linalg.norm(t, axis=-1, keepdims=True)
            ok = (nt > 0) & (nv > 0)
            s = jnp.where(ok, nv / jnp.where(ok, nt, 1), 1)
            st = s * t  # v = 0 or t = 0: T[v, t] = 0 (a zero v is a valid kernel input)
            diff = third(w, v + st) - third(w, v - st)
            return jnp.where(ok, diff / (4 * s), 0)

        def third_jvp(primals, tangents):
            w, v = primals
            tw, tv = tangents
            out = third(w, v)
            if not zero(tw):
                raise NotImplementedError(
                    "pysharp.jax.third is not differentiable in w (that needs the fourth "
                    "derivative); it is differentiable in v")
            if zero(tv):
                return out, jnp.zeros_like(out)
            return out, 2 * polar(w, v, tv)

        third.defjvp(third_jvp, symbolic_zeros=True)

        @jax.custom_jvp
        def hvp(w, v):
            return pair_raw("hvp", w, v)

        def hvp_jvp(primals, tangents):
            w, v = primals
            tw, tv = tangents
            out = hvp(w, v)
            dot = jnp.zeros_like(out)
            if not zero(tv):
                dot = dot + hvp(w, tv)
            if not zero(tw):
                dot = dot + polar(w, v, tw)
            return out, dot

        hvp.defjvp(hvp_jvp, symbolic_zeros=True)

        @jax.custom_jvp
        def lg(w):
            return lg_raw(w)

        @lg.defjvp
        def lg_jvp(primals, tangents):
            (w,), (t,) = primals, tangents
            L, G = lg(w)
            return (L, G), (jnp.sum(G * t, axis=-1), hvp(w, t))

        @jax.custom_jvp
        def loss(w):
            return lg_raw(w)[0]

        @loss.defjvp
        def loss_jvp(primals, tangents):
            (w,), (t,) = primals, tangents
            L, G = lg(w)
            return L, jnp.sum(G * t, axis=-1)

        self.loss, self.lg, self.hvp, self.third = loss, lg, hvp, third
        self.hessian = hessian_raw

    @property
    def path(self) -> str:
        """How the kernels are called now: "ffi", "direct" or "pure_callback"."""
        if self._ffi is not None and not self._ffi.failed:
            return "ffi"
        return self._callback_path


_OPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ops(model) -> _Ops:
    if not isinstance(model, ScaleInvariantModel):
        raise TypeError(f"model must be a pysharp model (ScaleInvariantModel or a loaded "
                        f"model), got {type(model).__name__}")
    ops = _OPS.get(model)
    if ops is None or ops.requested != CALLBACK_PATH:
        ops = _OPS[model] = _Ops(model, CALLBACK_PATH)
    return ops


def _as_input(x, dim: int, name: str):
    """A float32/float64 JAX array of shape (D,) or (B, D); integers become the default float."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ or not (jnp.issubdtype(x.dtype, jnp.floating)
                                    or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{name} must be a real floating or integer array, got dtype {x.dtype}")
    if jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.result_type(float))
    if x.dtype not in _KERNEL_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; pysharp's kernels run in float64 or "
                        f"float32 (cast explicitly, e.g. {name}.astype(jnp.float32))")
    if x.ndim not in (1, 2) or x.shape[-1] != dim or (x.ndim == 2 and x.shape[0] < 1):
        raise ValueError(f"{name} must have shape ({dim},) or (B, {dim}) with B >= 1, "
                         f"got {x.shape}")
    return x


def _pair(model, w, v):
    ops = _ops(model)
    w = _as_input(w, ops.dim, "w")
    v = _as_input(v, ops.dim, "v")
    if v.dtype != w.dtype:
        raise TypeError(f"v has dtype {v.dtype} but w has {w.dtype}; pass both in one dtype")
    if w.ndim == 2 and v.ndim == 2 and w.shape[0] != v.shape[0] and 1 not in (w.shape[0],
                                                                              v.shape[0]):
        raise ValueError(f"w has {w.shape[0]} rows but v has {v.shape[0]}; they must match or "
                         "one of them must be a single vector")
    return ops, w, v


def loss(model, w):
    """L(w): shape () for w (D,), (B,) for w (B, D). Differentiable (module docstring)."""
    ops = _ops(model)
    return ops.loss(_as_input(w, ops.dim, "w"))


def loss_and_grad(model, w):
    """(L(w), grad L(w)): shapes ((), (D,)) or ((B,), (B, D)); one kernel call."""
    ops = _ops(model)
    return ops.lg(_as_input(w, ops.dim, "w"))


def hvp(model, w, v):
    """H(w) v, exact; v (D,) or (B, D), a single vector broadcasts against a batch."""
    ops, w, v = _pair(model, w, v)
    return ops.hvp(w, v)


def third(model, w, v):
    """D^3L(w)[v, v]: the vector d/dt H(w + t v) v at t = 0."""
    ops, w, v = _pair(model, w, v)
    return ops.third(w, v)


def hessian(model, w):
    """Dense Hessian, (D, D) or (B, D, D) (D HVPs per point in the core); not differentiable."""
    ops = _ops(model)
    return ops.hessian(_as_input(w, ops.dim, "w"))
