"""pysharp's exact kernels as PyTorch custom operators: autograd, torch.func and torch.compile.

::

    import torch
    import pysharp as ps
    import pysharp.torch as pst

    model = ps.BNLinearRegression.synthetic(d=40, n=20)
    w = torch.tensor(model.random_point(8), requires_grad=True)   # (B, D) float64
    pst.loss(model, w).sum().backward()        # w.grad from the gradient kernel
    L, G = pst.loss_and_grad(model, w.detach())
    f = lambda w: pst.loss(model, w)
    G = torch.func.vmap(torch.func.grad(f))(w.detach())   # one kernel call on the batch
    H = torch.func.hessian(f)(w.detach()[0])              # rows from the HVP kernel

Functions (``model`` is any :class:`pysharp.ScaleInvariantModel`, built-in or
loaded with :func:`pysharp.load_model`; ``w`` and ``v`` are CPU tensors of shape
(D,) or (B, D), float64 or float32):

- :func:`loss` -- L(w), () or (B,); its gradient is the one the forward kernel
  call computed (no second call), the gradient's derivative the HVP kernel.
- :func:`loss_and_grad` -- (L, grad L) from one kernel call; differentiable
  (the gradient's derivative is the HVP kernel).
- :func:`hvp` -- H(w) v; derivative in v the HVP kernel (H is symmetric), in w
  ``D^3L(w)[v, .]`` from the third-order kernel by polarization.
- :func:`third` -- D^3L(w)[v, v]; differentiable in v (``2 D^3L(w)[v, .]``); in w it
  would be the fourth derivative of the loss, which no kernel gives: NotImplementedError.
- :func:`hessian` -- dense Hessian, (D, D) or (B, D, D); not differentiable.

Every derivative is exact (kernels, no finite steps) and differentiable again, up to the
third derivative of the loss, outside ``torch.compile`` (see below):

- autograd: ``backward``, ``torch.autograd.grad`` with ``create_graph=True`` (double and
  triple backward), ``torch.autograd.forward_ad``;
- ``torch.func``: ``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd``,
  ``hessian`` (jacfwd over jacrev), and ``vmap`` of any of them, which is one kernel call
  on the whole batch (nested vmaps too).
- Refused with NotImplementedError rather than answered wrongly: forward mode nested in
  forward mode (``jacfwd(jacfwd(f))``, ``jvp`` of a ``jvp``). Torch 2.13 drops the outer
  tangent of what an ``autograd.Function``'s jvp rule computes (pytorch/pytorch#197867), so
  it would return zeros for the second derivative. Put a reverse transform inside
  (``torch.func.hessian``, ``jacrev(jacrev(f))``, ``jacrev(jacfwd(f))``).

Design: the operators are ``torch.library.custom_op``\\ s in the ``pysharp``
namespace (``torch.ops.pysharp.loss_and_grad``, ``hvp``, ``third``, ``hessian``),
each with ``register_fake`` (shapes for torch.compile / FakeTensor),
``register_autograd`` and ``register_vmap``. A custom op's autograd cannot serve
``torch.func`` (functorch asks for an ``autograd.Function`` with ``setup_context``), so
the public functions call ``autograd.Function``\\ s whose forwards call the operators and
whose backward and jvp rules (the same formulas as the operators') call the Functions
again; their vmap rule is generated from the operators'. An operator's arguments can only
be tensors and plain values, so the model travels as an integer handle: :func:`handle`
registers the model in a table of weak references keyed by ``id(model)`` and
returns that id (the functions above do it for you). The table never keeps a
model alive; a handle of a collected model raises. Under ``torch.compile`` the
functions call the operators themselves (Dynamo refuses an ``autograd.Function`` with a
jvp rule), so a compiled graph holds the operators with their autograd: ``backward``
through a compiled function works. Keep higher derivatives outside ``torch.compile``:
torch.compile does not differentiate a compiled backward again, and Dynamo fails on
``torch.compile(torch.func.hessian(f))`` (it traces the operators under functorch, whose
custom-op autograd has no ``setup_context``). The handle is a constant of
the compiled graph (Dynamo guards on the model object the function closes over), and the
operator stays opaque: the graph calls the compiled kernel, Inductor fuses what is around it.

Inputs are read in place (``Tensor.numpy()`` on a contiguous CPU tensor, no copy);
outputs are fresh tensors built on the kernels' NumPy results without a copy.
CUDA tensors are refused for now (the GPU variants come with the GPU issue).
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised without torch installed
    raise ImportError("pysharp.torch needs PyTorch, which is not installed: "
                      "`pip install torch` (see https://pytorch.org/get-started/)") from exc

import weakref

import numpy as np

from .models import ScaleInvariantModel

__all__ = ["loss", "loss_and_grad", "hvp", "third", "hessian", "handle"]

_MODELS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_FLOATS = (torch.float64, torch.float32)


@torch.compiler.assume_constant_result
def _register(model) -> int:
    key = id(model)
    if _MODELS.get(key) is not model:
        _MODELS[key] = model
    return key


def handle(model) -> int:
    """The integer by which the operators find ``model`` (its id, registered weakly)."""
    if not isinstance(model, ScaleInvariantModel):
        raise TypeError(f"model must be a pysharp model (ScaleInvariantModel or a loaded "
                        f"model), got {type(model).__name__}")
    return _register(model)


def _model(key: int):
    model = _MODELS.get(key)
    if model is None:
        raise RuntimeError(f"no live pysharp model has handle {key}; the handle comes from "
                           "pysharp.torch.handle(model) and lives as long as the model")
    return model


def _np(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (a copy only where it is not contiguous)."""
    if t.device.type != "cpu":
        raise ValueError(f"pysharp.torch runs on CPU tensors; got a tensor on {t.device} "
                         "(the GPU variants come with pysharp's GPU support)")
    return t.detach().contiguous().numpy()


def _out(x) -> torch.Tensor:
    """A tensor on a kernel's fresh NumPy result (shares its memory: no copy)."""
    a = np.asarray(x)
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))


# -- the operators ----------------------------------------------------------------------
@torch.library.custom_op("pysharp::loss_and_grad", mutates_args=())
def _loss_and_grad(model: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    L, G = _model(model).loss_and_grad(_np(w))
    return _out(L), _out(G)


@_loss_and_grad.register_fake
def _(model, w):
    return w.new_empty(w.shape[:-1]), torch.empty_like(w)


@torch.library.custom_op("pysharp::hvp", mutates_args=())
def _hvp(model: int, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _out(_model(model).hvp(_np(w), _np(v)))


@torch.library.custom_op("pysharp::third", mutates_args=())
def _third(model: int, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _out(_model(model).third(_np(w), _np(v)))


def _pair_fake(model, w, v):
    return w.new_empty(torch.broadcast_shapes(w.shape, v.shape))


_hvp.register_fake(_pair_fake)
_third.register_fake(_pair_fake)


@torch.library.custom_op("pysharp::hessian", mutates_args=())
def _hessian(model: int, w: torch.Tensor) -> torch.Tensor:
    return _out(_model(model).hessian(_np(w)))


@_hessian.register_fake
def _(model, w):
    return w.new_empty(tuple(w.shape) + (w.shape[-1],))


# -- derivatives --------------------------------------------------------------------------
# One set of formulas, written over the HVP and third-order maps they call:
#   d loss = grad L (the forward call's own gradient), d grad L = H (the HVP kernel),
#   d (H v) = D^3L[v, .] (the third-order kernel, polarized), d_v D^3L[v, v] = 2 D^3L[v, .].
# The derivative of third in w is the fourth derivative, which no kernel gives: an error.
# The operators' register_autograd formulas call the operators (autograd, torch.compile);
# the autograd.Functions below call the Functions, so each derivative is differentiable in
# turn under torch.func as well.
_FOURTH = ("pysharp.torch.third is not differentiable in w: that is the fourth derivative of the "
           "loss, which pysharp's kernels do not compute; it is differentiable in v")


def _polarized(third, key: int, w, v, t):
    """D^3L(w)[v, t] from T(u) = D^3L(w)[u, u] (``third``): (T(v + s t) - T(v - s t)) / (4 s).

    Exact for every s > 0, T being a quadratic form in u, and so are its derivatives in w, v
    and t; s = |v| / |t| balances the two arguments (s = 1 / |t| where v = 0, 1 where t = 0).
    w, v and t have one shape.
    """
    nv = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    nt = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    s = (torch.where(nv > 0, nv, torch.ones_like(nv))
         / torch.where(nt > 0, nt, torch.ones_like(nt)))
    st = s * t
    return (third(key, w, v + st) - third(key, w, v - st)) / (4 * s)


def _broadcast(*xs):
    shape = torch.broadcast_shapes(*(x.shape for x in xs))
    return tuple(x.expand(shape) for x in xs)


def _sum_to(x, shape):
    """Reduce a broadcast derivative back to an input's shape ((D,) from (B, D))."""
    return x.sum(0) if x.dim() > len(shape) else x


def _lg_vjp(hvp, key, w, G, gL, gG):
    """d/dw of <L, gL> + <grad L, gG>: gL grad L + H gG (either cotangent may be None)."""
    dw = None
    if gL is not None:
        dw = gL.unsqueeze(-1) * G
    if gG is not None:
        h = hvp(key, w, gG)
        dw = h if dw is None else dw + h
    return dw


def _hvp_vjp(hvp, third, key, w, v, g, need_w, need_v):
    """d/dw and d/dv of <H(w) v, g>: D^3L(w)[v, g] and H(w) g (H is symmetric)."""
    dw = dv = None
    if need_v:
        dv = _sum_to(hvp(key, w, g), v.shape)
    if need_w:
        dw = _sum_to(_polarized(third, key, *_broadcast(w, v, g)), w.shape)
    return dw, dv


def _third_vjp(third, key, w, v, g, need_w, need_v):
    """d/dv of <D^3L(w)[v, v], g>: 2 D^3L(w)[v, g]; in w it is the fourth derivative."""
    if need_w:
        raise NotImplementedError(_FOURTH)
    return None, (_sum_to(2 * _polarized(third, key, *_broadcast(w, v, g)), v.shape)
                  if need_v else None)


# -- the operators' autograd (backward, double backward; what torch.compile traces) -----
def _lg_setup(ctx, inputs, output):
    model, w = inputs
    ctx.model = model
    ctx.set_materialize_grads(False)  # an unused output (L alone) costs no HVP call
    ctx.save_for_backward(w, output[1])


def _lg_backward(ctx, gL, gG):
    return None, _lg_vjp(_hvp, ctx.model, *ctx.saved_tensors, gL, gG)


def _pair_setup(ctx, inputs, output):
    model, w, v = inputs
    ctx.model = model
    ctx.save_for_backward(w, v)


def _hvp_backward(ctx, g):
    return (None, *_hvp_vjp(_hvp, _third, ctx.model, *ctx.saved_tensors, g,
                            *ctx.needs_input_grad[1:]))


def _third_backward(ctx, g):
    return (None, *_third_vjp(_third, ctx.model, *ctx.saved_tensors, g,
                              *ctx.needs_input_grad[1:]))


_loss_and_grad.register_autograd(_lg_backward, setup_context=_lg_setup)
_hvp.register_autograd(_hvp_backward, setup_context=_pair_setup)
_third.register_autograd(_third_backward, setup_context=_pair_setup)


# -- torch.func.vmap ----------------------------------------------------------------------
# The kernels take any batch, so a vmapped call is one kernel call on the flattened batch.
def _to_front(x, bdim, n):
    """x with its vmapped axis first (expanded to n where it has none)."""
    return x.movedim(bdim, 0) if bdim is not None else x.expand(n, *x.shape)


def _lg_vmap(info, in_dims, model, w):
    x = _to_front(w, in_dims[1], info.batch_size)
    L, G = _loss_and_grad(model, x.reshape(-1, x.shape[-1]))
    return (L.reshape(x.shape[:-1]), G.reshape(x.shape)), (0, 0)


def _pair_vmap(op):
    def rule(info, in_dims, model, w, v):
        n = info.batch_size
        w, v = _to_front(w, in_dims[1], n), _to_front(v, in_dims[2], n)
        shape = (n,) + torch.broadcast_shapes(w.shape[1:], v.shape[1:])
        # a single vector against a batch: its axes broadcast after the vmapped one
        w, v = (x.reshape(x.shape[:1] + (1,) * (len(shape) - x.dim()) + x.shape[1:])
                .expand(shape) for x in (w, v))
        out = op(model, w.reshape(-1, shape[-1]), v.reshape(-1, shape[-1]))
        return out.reshape(shape), 0
    return rule


def _hessian_vmap(info, in_dims, model, w):
    x = _to_front(w, in_dims[1], info.batch_size)
    return _hessian(model, x.reshape(-1, x.shape[-1])).reshape(x.shape + x.shape[-1:]), 0


torch.library.register_vmap(_loss_and_grad, _lg_vmap)
torch.library.register_vmap(_hvp, _pair_vmap(_hvp))
torch.library.register_vmap(_third, _pair_vmap(_third))
torch.library.register_vmap(_hessian, _hessian_vmap)


# -- torch.func and autograd to every order the kernels reach ------------------------------
# The public functions call these autograd.Functions (setup_context, jvp, a generated vmap
# rule), so torch.func.grad / jacrev / jacfwd / hessian / vmap compose with them, as does
# autograd with create_graph. Their forwards call the operators above (one kernel call, and
# one kernel call on a whole vmapped batch); their backward and jvp rules call these
# Functions again, so each derivative is differentiable in turn.
try:  # functorch's stack of transforms, to refuse forward mode nested in forward mode
    from torch._C._functorch import TransformType as _TransformType
    from torch._functorch.pyfunctorch import (
        retrieve_all_functorch_interpreters as _interpreters,
    )
except ImportError:  # pragma: no cover - a torch without them: refuse every forward-mode rule
    _interpreters = None

_NESTED_FORWARD = (
    "pysharp.torch: forward mode nested in forward mode (torch.func.jacfwd/jvp over "
    "jacfwd/jvp) is refused: torch 2.13 drops the outer tangent of what an autograd.Function's "
    "jvp rule computes there, so it would return wrong higher derivatives (pytorch/pytorch"
    "#197867). Put a reverse transform inside: torch.func.hessian (jacfwd over jacrev), "
    "jacrev over jacrev and jacrev over jacfwd are exact")


def _check_forward_mode():
    """Raise where a jvp rule runs under two functorch forward-mode levels or more."""
    if _interpreters is None:
        raise NotImplementedError(_NESTED_FORWARD + " (this torch has no "
                                  "torch._functorch.pyfunctorch to tell)")
    if sum(i.key() == _TransformType.Jvp for i in _interpreters()) > 1:
        raise NotImplementedError(_NESTED_FORWARD)


class _LossAndGrad(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(key, w):
        return _loss_and_grad(key, w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.key = inputs[0]
        ctx.set_materialize_grads(False)  # an unused output (L alone) costs no HVP call
        ctx.save_for_backward(inputs[1], output[1])
        ctx.save_for_forward(inputs[1], output[1])

    @staticmethod
    def backward(ctx, gL, gG):
        return None, _lg_vjp(_Hvp.apply, ctx.key, *ctx.saved_tensors, gL, gG)

    @staticmethod
    def jvp(ctx, _, tw):
        # (dL, d grad L) along tw: (<grad L, tw>, H tw)
        _check_forward_mode()
        w, G = ctx.saved_tensors
        return (G * tw).sum(-1), _Hvp.apply(ctx.key, w, tw)


class _PointAndDirection(torch.autograd.Function):
    """What the Functions of (key, w, v) share: the saved point and direction."""

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.key = inputs[0]
        ctx.set_materialize_grads(False)  # no tangent for w (or v): None, not zeros
        ctx.save_for_backward(inputs[1], inputs[2])
        ctx.save_for_forward(inputs[1], inputs[2])


class _Hvp(_PointAndDirection):
    @staticmethod
    def forward(key, w, v):
        return _hvp(key, w, v)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        return (None, *_hvp_vjp(_Hvp.apply, _Third.apply, ctx.key, *ctx.saved_tensors, g,
                                *ctx.needs_input_grad[1:]))

    @staticmethod
    def jvp(ctx, _, tw, tv):
        # d (H(w) v) = D^3L(w)[v, tw] + H(w) tv
        _check_forward_mode()
        w, v = ctx.saved_tensors
        out = None
        if tv is not None:
            out = _Hvp.apply(ctx.key, *_broadcast(w, tv))
        if tw is not None:
            d = _polarized(_Third.apply, ctx.key, *_broadcast(w, v, tw))
            out = d if out is None else out + d
        return out


class _Third(_PointAndDirection):
    @staticmethod
    def forward(key, w, v):
        return _third(key, w, v)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        return (None, *_third_vjp(_Third.apply, ctx.key, *ctx.saved_tensors, g,
                                  *ctx.needs_input_grad[1:]))

    @staticmethod
    def jvp(ctx, _, tw, tv):
        # d D^3L(w)[v, v] = 2 D^3L(w)[v, tv] + (fourth derivative)[tw]
        if tw is not None:
            raise NotImplementedError(_FOURTH)
        _check_forward_mode()
        w, v = ctx.saved_tensors
        return 2 * _polarized(_Third.apply, ctx.key, *_broadcast(w, v, tv))


# -- the public functions ---------------------------------------------------------------
def _check(x, dim: int, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__} "
                        "(for NumPy arrays call the model's own methods)")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} has dtype {x.dtype}; pysharp's kernels run in float64 or "
                        f"float32 (cast explicitly, e.g. {name}.double())")
    if x.dim() not in (1, 2) or x.shape[-1] != dim or (x.dim() == 2 and x.shape[0] < 1):
        raise ValueError(f"{name} must have shape ({dim},) or (B, {dim}) with B >= 1, "
                         f"got {tuple(x.shape)}")
    return x


def _pair(model, w, v):
    key = handle(model)
    w, v = _check(w, model.dim, "w"), _check(v, model.dim, "v")
    if v.dtype != w.dtype:
        raise TypeError(f"v has dtype {v.dtype} but w has {w.dtype}; pass both in one dtype")
    if w.dim() == 2 and v.dim() == 2 and w.shape[0] != v.shape[0] and 1 not in (w.shape[0],
                                                                                v.shape[0]):
        raise ValueError(f"w has {w.shape[0]} rows but v has {v.shape[0]}; they must match or "
                         "one of them must be a single vector")
    return key, w, v


def _apply(function, op, *args):
    """function.apply(*args) where a derivative may be taken, else the custom op itself.

    Dynamo refuses an autograd.Function with a jvp rule ("Unsupported custom jvp"), so a
    compiled region calls the operator, whose register_autograd formulas are the same
    backward and double backward. Eagerly, a call that no transform, no forward-mode level
    and no tensor requiring grad can differentiate skips the Function (tens of microseconds
    per call).
    """
    if torch.compiler.is_compiling():
        return op(*args)
    if (_transforms_active() or _forward_level() >= 0
            or (torch.is_grad_enabled()
                and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))):
        return function.apply(*args)
    return op(*args)


# torch internals read by _apply; without them (another torch) every call takes the Function
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def _forward_level() -> int:
    """The innermost torch.autograd.forward_ad level, -1 outside any (0 where unknown)."""
    return getattr(torch.autograd.forward_ad, "_current_level", 0)


def loss_and_grad(model, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L(w), grad L(w)), shapes ((), (D,)) or ((B,), (B, D)), from one kernel call."""
    key = handle(model)
    return _apply(_LossAndGrad, _loss_and_grad, key, _check(w, model.dim, "w"))


def loss(model, w: torch.Tensor) -> torch.Tensor:
    """L(w), () or (B,); differentiable (backward reuses the gradient of the forward call)."""
    return loss_and_grad(model, w)[0]


def hvp(model, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """H(w) v, exact; a single vector broadcasts against a batch."""
    return _apply(_Hvp, _hvp, *_pair(model, w, v))


def third(model, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """D^3L(w)[v, v]: the vector d/dt H(w + t v) v at t = 0."""
    return _apply(_Third, _third, *_pair(model, w, v))


def hessian(model, w: torch.Tensor) -> torch.Tensor:
    """Dense Hessian, (D, D) or (B, D, D); not differentiable."""
    key = handle(model)
    return _hessian(key, _check(w, model.dim, "w"))
