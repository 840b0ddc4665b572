"""pysharp's exact kernels as PyTorch custom operators: autograd and torch.compile work.

::

    import torch
    import pysharp as ps
    import pysharp.torch as pst

    model = ps.BNLinearRegression.synthetic(d=40, n=20)
    w = torch.tensor(model.random_point(8), requires_grad=True)   # (B, D) float64
    pst.loss(model, w).sum().backward()        # w.grad from the gradient kernel
    L, G = pst.loss_and_grad(model, w.detach())

Functions (``model`` is any :class:`pysharp.ScaleInvariantModel`, built-in or
loaded with :func:`pysharp.load_model`; ``w`` and ``v`` are CPU tensors of shape
(D,) or (B, D), float64 or float32):

- :func:`loss` -- L(w), () or (B,); ``backward`` uses the gradient the forward
  kernel computed (no second call), double backward the HVP kernel.
- :func:`loss_and_grad` -- (L, grad L) from one kernel call; differentiable
  (the gradient's backward is the HVP kernel).
- :func:`hvp` -- H(w) v; backward in v is the HVP kernel (H is symmetric), in w
  ``D^3L(w)[v, g]`` from the third-order kernel by polarization.
- :func:`third` -- D^3L(w)[v, v]; backward in v only (in w it would need the
  fourth derivative: NotImplementedError).
- :func:`hessian` -- dense Hessian, (D, D) or (B, D, D); not differentiable.

Design: the operators are ``torch.library.custom_op``\\ s in the ``pysharp``
namespace (``torch.ops.pysharp.loss_and_grad``, ``hvp``, ``third``, ``hessian``),
each with ``register_fake`` (shapes for torch.compile / FakeTensor) and
``register_autograd``. An operator's arguments can only be tensors and
plain values, so the model travels as an integer handle: :func:`handle`
registers the model in a table of weak references keyed by ``id(model)`` and
returns that id (the functions above do it for you). The table never keeps a
model alive; a handle of a collected model raises. Under ``torch.compile`` the
handle is a constant of the compiled graph (Dynamo guards on the model object
the function closes over), and the operator stays opaque: the graph calls the
compiled kernel, Inductor fuses what is around it. ``torch.func.vmap`` rules make a
vmapped call (nested too) one kernel call on the whole batch. ``torch.func.grad`` and the
other function transforms of derivatives refuse these operators in torch 2.13 (the
autograd of a ``custom_op`` has no ``setup_context`` for functorch); use autograd
(``backward``, ``torch.autograd.grad``) on a (B, D) batch instead.

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


# -- autograd ---------------------------------------------------------------------------
def _polar(model: int, w, v, t):
    """D^3L(w)[v, t] = (T(v + s t) - T(v - s t)) / (4 s), T(u) = D^3L[u, u], s = |v| / |t|."""
    nv = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    nt = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    ok = (nt > 0) & (nv > 0)
    s = torch.where(ok, nv / torch.where(ok, nt, torch.ones_like(nt)), torch.ones_like(nt))
    st = s * t
    diff = _third(model, w, v + st) - _third(model, w, v - st)
    return torch.where(ok, diff / (4 * s), torch.zeros_like(diff))


def _sum_to(x, shape):
    """Reduce a broadcast gradient back to an input's shape ((D,) from (B, D))."""
    return x.sum(0) if x.dim() > len(shape) else x


def _lg_setup(ctx, inputs, output):
    model, w = inputs
    ctx.model = model
    ctx.set_materialize_grads(False)  # an unused output (L alone) costs no HVP call
    ctx.save_for_backward(w, output[1])


def _lg_backward(ctx, gL, gG):
    w, G = ctx.saved_tensors
    dw = None
    if gL is not None:
        dw = gL.unsqueeze(-1) * G
    if gG is not None:
        h = _hvp(ctx.model, w, gG)
        dw = h if dw is None else dw + h
    return None, dw


_loss_and_grad.register_autograd(_lg_backward, setup_context=_lg_setup)


def _pair_setup(ctx, inputs, output):
    model, w, v = inputs
    ctx.model = model
    ctx.save_for_backward(w, v)


def _hvp_backward(ctx, g):
    w, v = ctx.saved_tensors
    dw = dv = None
    if ctx.needs_input_grad[2]:
        dv = _sum_to(_hvp(ctx.model, w, g), v.shape)
    if ctx.needs_input_grad[1]:
        wb = w.expand(g.shape) if w.shape != g.shape else w
        vb = v.expand(g.shape) if v.shape != g.shape else v
        dw = _sum_to(_polar(ctx.model, wb, vb, g), w.shape)
    return None, dw, dv


def _third_backward(ctx, g):
    w, v = ctx.saved_tensors
    if ctx.needs_input_grad[1]:
        raise NotImplementedError("pysharp.torch.third is not differentiable in w (that needs "
                                  "the fourth derivative); it is differentiable in v")
    dv = None
    if ctx.needs_input_grad[2]:
        wb = w.expand(g.shape) if w.shape != g.shape else w
        vb = v.expand(g.shape) if v.shape != g.shape else v
        dv = _sum_to(2 * _polar(ctx.model, wb, vb, g), v.shape)
    return None, None, dv


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
        w, v = w.expand(shape), v.expand(shape)
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


def loss_and_grad(model, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L(w), grad L(w)), shapes ((), (D,)) or ((B,), (B, D)), from one kernel call."""
    key = handle(model)
    return _loss_and_grad(key, _check(w, model.dim, "w"))


def loss(model, w: torch.Tensor) -> torch.Tensor:
    """L(w), () or (B,); differentiable (backward reuses the gradient of the forward call)."""
    return loss_and_grad(model, w)[0]


def hvp(model, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """H(w) v, exact; a single vector broadcasts against a batch."""
    return _hvp(*_pair(model, w, v))


def third(model, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """D^3L(w)[v, v]: the vector d/dt H(w + t v) v at t = 0."""
    return _third(*_pair(model, w, v))


def hessian(model, w: torch.Tensor) -> torch.Tensor:
    """Dense Hessian, (D, D) or (B, D, D); not differentiable."""
    key = handle(model)
    return _hessian(key, _check(w, model.dim, "w"))
