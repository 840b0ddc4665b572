"""pysharp.torch: custom ops (opcheck), autograd to second order, torch.compile."""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest
from _cases import EXAMPLE_MODELS, example_module

torch = pytest.importorskip("torch")

import pysharp as ps  # noqa: E402
import pysharp.torch as pst  # noqa: E402

OPS = ("loss_and_grad", "hvp", "third", "hessian")
# torch's first forward-mode call in a process imports torch._decomp.decompositions_for_jvp,
# which calls the deprecated torch.jit.script: a warning of torch's own, not of pysharp's
FORWARD_AD = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def model():
    return ps.BNLinearRegression.synthetic(d=40, n=20)


def bn_loss(model):
    """BN linear regression in torch (docs/theory.rst): population BN of X w, (B,) losses."""
    X, y = torch.tensor(model.X), torch.tensor(model.y)

    def loss(w):
        z = w @ X.T
        zc = z - z.mean(-1, keepdim=True)
        p = y.std(unbiased=False) * zc / torch.sqrt((zc ** 2).mean(-1, keepdim=True)) + y.mean()
        return ((p - y) ** 2).mean(-1)

    return loss


def points(model, batch=5, seed=0, dtype=torch.float64):
    return torch.tensor(model.random_point(batch, seed=seed, norm=1.7)).to(dtype)


@contextlib.contextmanager
def counted_kernel_calls(model):
    """The shapes of w in every call of ``model.loss_and_grad`` inside the block."""
    calls = []
    original = model.loss_and_grad

    def counted(w, *a, **k):
        calls.append(np.shape(w))
        return original(w, *a, **k)

    model.loss_and_grad = counted
    try:
        yield calls
    finally:
        del model.loss_and_grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_opcheck(model, dtype):
    key = pst.handle(model)
    W, V = points(model, dtype=dtype), points(model, seed=1, dtype=dtype)
    cases = {"loss_and_grad": [(key, W), (key, W[0])],
             "hvp": [(key, W, V), (key, W[0], V)],
             "third": [(key, W, V), (key, W, V[0])],
             "hessian": [(key, W)]}
    for name in OPS:
        op = getattr(torch.ops.pysharp, name)
        for args in cases[name]:
            # third is differentiable in v only; the Hessian not at all
            grad_args = tuple(a.clone().requires_grad_(name != "hessian"
                                                       and (name != "third" or i == 2))
                              if isinstance(a, torch.Tensor) else a
                              for i, a in enumerate(args))
            for a in (args, grad_args):
                result = torch.library.opcheck(op, a)
                assert all(v == "SUCCESS" for v in result.values()), (name, result)


def test_values_match_kernels(model):
    W, V = points(model), points(model, seed=1)
    L, G = pst.loss_and_grad(model, W)
    L0, G0 = model.loss_and_grad(W.numpy())
    np.testing.assert_array_equal(L.numpy(), L0)
    np.testing.assert_array_equal(G.numpy(), G0)
    assert pst.loss(model, W[0]).shape == ()
    np.testing.assert_array_equal(pst.hvp(model, W, V).numpy(), model.hvp(W.numpy(), V.numpy()))
    np.testing.assert_array_equal(pst.third(model, W, V[0]).numpy(),
                                  model.third(W.numpy(), V[0].numpy()))
    np.testing.assert_array_equal(pst.hessian(model, W).numpy(), model.hessian(W.numpy()))
    W32 = W.float()
    L32, G32 = pst.loss_and_grad(model, W32)
    assert L32.dtype == G32.dtype == torch.float32
    np.testing.assert_array_equal(G32.numpy(), model.grad(W32.numpy()))


def test_autograd_matches_torch(model):
    ref = bn_loss(model)
    W = points(model, 4, seed=2)
    w1, w2 = W.clone().requires_grad_(), W.clone().requires_grad_()
    pst.loss(model, w1).sum().backward()
    ref(w2).sum().backward()
    np.testing.assert_allclose(w1.grad.numpy(), w2.grad.numpy(), rtol=0, atol=1e-13)


def test_double_backward_matches_torch(model):
    ref = bn_loss(model)
    w = points(model, 1, seed=3)[0]
    H = torch.autograd.functional.hessian(lambda w: pst.loss(model, w), w)
    H_ref = torch.autograd.functional.hessian(lambda w: ref(w[None])[0], w)
    np.testing.assert_allclose(H.numpy(), H_ref.numpy(), rtol=0, atol=1e-12)
    # grad of a function of the gradient (reverse over reverse)
    t = points(model, 1, seed=4)[0]
    outs = []
    for f in (lambda w: pst.loss(model, w), lambda w: ref(w[None])[0]):
        x = w.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        outs.append(torch.autograd.grad((g * t).sum(), x)[0])
    np.testing.assert_allclose(outs[0].numpy(), outs[1].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(outs[0].numpy(), model.hvp(w.numpy(), t.numpy()), rtol=0,
                               atol=1e-15)


# -- torch.func: derivative transforms through the autograd.Functions -----------------------
def test_func_grad_matches_torch(model):
    ref = bn_loss(model)
    W = points(model, 4, seed=10)
    for w in W:
        g = torch.func.grad(lambda w: pst.loss(model, w))(w)
        np.testing.assert_allclose(g.numpy(), torch.func.grad(ref)(w).numpy(), rtol=0,
                                   atol=1e-13)
        np.testing.assert_array_equal(g.numpy(), model.grad(w.numpy()))  # the kernel's own
    # of loss_and_grad's loss output, and grad_and_value
    g, L = torch.func.grad_and_value(lambda w: pst.loss_and_grad(model, w)[0])(W[0])
    np.testing.assert_array_equal(g.numpy(), model.grad(W[0].numpy()))
    assert L.item() == model.loss(W[0].numpy())


@FORWARD_AD
def test_func_hessian_matches_torch(model):
    ref = bn_loss(model)
    w = points(model, 1, seed=11)[0]
    f = lambda w: pst.loss(model, w)  # noqa: E731
    H = torch.func.hessian(f)(w)                    # jacfwd over jacrev
    H_ref = torch.func.hessian(ref)(w)
    np.testing.assert_allclose(H.numpy(), H_ref.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(H.numpy(), model.hessian(w.numpy()))  # D HVP-kernel rows
    for transform in (torch.func.jacrev(torch.func.jacrev(f)),
                      torch.func.jacrev(torch.func.jacfwd(f)),
                      torch.func.jacfwd(torch.func.grad(f))):
        np.testing.assert_allclose(transform(w).numpy(), H_ref.numpy(), rtol=0, atol=1e-12)
    # the third derivative: reverse over the Hessian reaches the third-order kernel
    T_ref = torch.func.jacrev(torch.func.hessian(ref))(w)
    assert np.abs(T_ref.numpy()).max() > 1.0  # not a comparison of two zeros
    rev = torch.func.jacrev
    for T in (rev(torch.func.hessian(f))(w), rev(rev(rev(f)))(w)):
        np.testing.assert_allclose(T.numpy(), T_ref.numpy(), rtol=0,
                                   atol=1e-11 * np.abs(T_ref.numpy()).max())


@FORWARD_AD
def test_func_vmap_of_grad_and_hessian_is_one_kernel_call(model):
    ref = bn_loss(model)
    W = points(model, 6, seed=12)
    with counted_kernel_calls(model) as calls:
        G = torch.func.vmap(torch.func.grad(lambda w: pst.loss(model, w)))(W)
    assert calls == [(6, model.dim)]
    np.testing.assert_allclose(G.numpy(), torch.func.vmap(torch.func.grad(ref))(W).numpy(),
                               rtol=0, atol=1e-13)
    np.testing.assert_array_equal(G.numpy(), model.grad(W.numpy()))
    H = torch.func.vmap(torch.func.hessian(lambda w: pst.loss(model, w)))(W[:3])
    np.testing.assert_allclose(H.numpy(), torch.func.vmap(torch.func.hessian(ref))(W[:3]).numpy(),
                               rtol=0, atol=1e-12)


@FORWARD_AD
def test_create_graph_second_grad_is_the_hvp_kernel(model):
    # reverse over reverse on a (B, D) batch: grad of <grad L, t> is H t, from the HVP kernel
    W, T = points(model, 4, seed=13), points(model, 4, seed=14)
    x = W.clone().requires_grad_()
    (g,) = torch.autograd.grad(pst.loss(model, x).sum(), x, create_graph=True)
    np.testing.assert_array_equal(g.detach().numpy(), model.grad(W.numpy()))
    (Ht,) = torch.autograd.grad((g * T).sum(), x, create_graph=True)
    np.testing.assert_array_equal(Ht.detach().numpy(), model.hvp(W.numpy(), T.numpy()))
    # triple backward: grad of <H t, t> is D^3L[t, t], the third-order kernel (polarized)
    (D3,) = torch.autograd.grad((Ht * T).sum(), x)
    np.testing.assert_allclose(D3.numpy(), model.third(W.numpy(), T.numpy()), rtol=0,
                               atol=1e-12 * np.abs(model.third(W.numpy(), T.numpy())).max())
    # forward mode (torch.autograd.forward_ad) along T: dL = <grad L, T>, d grad L = H T
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        L, G = pst.loss_and_grad(model, fwAD.make_dual(W, T))
        dL, dG = fwAD.unpack_dual(L).tangent, fwAD.unpack_dual(G).tangent
    np.testing.assert_allclose(dL.numpy(), (model.grad(W.numpy()) * T.numpy()).sum(-1),
                               rtol=1e-14, atol=0)
    np.testing.assert_array_equal(dG.numpy(), model.hvp(W.numpy(), T.numpy()))


@FORWARD_AD
def test_func_derivatives_of_hvp_and_third(model):
    ref = bn_loss(model)
    w, v, t = points(model, 3, seed=15)

    def ref_hvp(w, v):
        return torch.func.jvp(torch.func.grad(ref), (w,), (v,))[1]

    f_hvp = lambda w, v: pst.hvp(model, w, v)  # noqa: E731
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        for argnums in (0, 1):
            J = transform(f_hvp, argnums=argnums)(w, v)
            J_ref = transform(ref_hvp, argnums=argnums)(w, v)
            np.testing.assert_allclose(J.numpy(), J_ref.numpy(), rtol=0, atol=1e-12,
                                       err_msg=f"{transform.__name__} argnums={argnums}")
    # jacrev in v is H itself (the HVP kernel on the basis)
    np.testing.assert_allclose(torch.func.jacrev(f_hvp, argnums=1)(w, v).numpy(),
                               model.hessian(w.numpy()), rtol=0, atol=1e-15)
    # third in v: d/dv D^3L[v, v] t = 2 D^3L[v, t], the w-derivative of H(w) v along t
    d_third = torch.func.jvp(lambda v: pst.third(model, w, v), (v,), (t,))[1]
    d_hvp = torch.func.jvp(lambda w: ref_hvp(w, v), (w,), (t,))[1]
    np.testing.assert_allclose(d_third.numpy(), 2 * d_hvp.numpy(), rtol=0, atol=1e-12)
    vjp_third = torch.func.vjp(lambda v: pst.third(model, w, v), v)[1](t)[0]
    np.testing.assert_allclose(vjp_third.numpy(), 2 * d_hvp.numpy(), rtol=0, atol=1e-12)


@FORWARD_AD
def test_func_hvp_of_a_single_vector_against_a_batch(model):
    ref = bn_loss(model)
    w, v = points(model, 2, seed=18)
    W, V = points(model, 3, seed=19), points(model, 4, seed=20)
    Wn, Vn = W.numpy(), V.numpy()
    # vmap over single points, each against the whole batch V: (3, 4, D), one kernel call
    out = torch.func.vmap(lambda w: pst.hvp(model, w, V))(W)
    np.testing.assert_array_equal(out.numpy(), np.stack([model.hvp(x, Vn) for x in Wn]))
    out = torch.func.vmap(lambda v: pst.hvp(model, W, v))(V)
    np.testing.assert_array_equal(out.numpy(), np.stack([model.hvp(Wn, x) for x in Vn]))

    def ref_hvp(w, v):
        return torch.func.jvp(torch.func.grad(ref), (w,), (v,))[1]

    ref_batch_v = torch.func.vmap(ref_hvp, in_dims=(None, 0))
    ref_batch_w = torch.func.vmap(ref_hvp, in_dims=(0, None))
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        for f, f_ref, args in (
                (lambda w, V: pst.hvp(model, w, V), ref_batch_v, (w, V)),
                (lambda W, v: pst.hvp(model, W, v), ref_batch_w, (W, v))):
            for argnums in (0, 1):
                J = transform(f, argnums=argnums)(*args)
                J_ref = transform(f_ref, argnums=argnums)(*args)
                np.testing.assert_allclose(J.numpy(), J_ref.numpy(), rtol=0, atol=1e-12)

@FORWARD_AD
def test_refused_derivatives_raise(model):
    w, v = points(model, 2, seed=16)
    f = lambda w: pst.loss(model, w)  # noqa: E731
    # third in w is the fourth derivative of the loss: no kernel gives it
    for transform in (torch.func.jacrev, torch.func.jacfwd):
        with pytest.raises(NotImplementedError, match="not differentiable in w"):
            transform(lambda w: pst.third(model, w, v))(w)
    # the fourth derivative of the loss: w-gradient of D^3L(w)[v, v] . v, reverse mode
    d3 = lambda w: torch.func.grad(lambda w: (pst.hvp(model, w, v) * v).sum())(w)  # noqa: E731
    assert torch.isfinite(d3(w)).all()  # the third derivative is fine
    with pytest.raises(NotImplementedError, match="not differentiable in w"):
        torch.func.grad(lambda w: d3(w).sum())(w)
    # forward over forward: torch would return wrong numbers (pytorch/pytorch#197867)
    for transform in (torch.func.jacfwd(torch.func.jacfwd(f)),
                      torch.func.jacfwd(torch.func.hessian(f)),
                      lambda w: torch.func.jvp(lambda w: torch.func.jvp(f, (w,), (v,))[1],
                                               (w,), (v,))[1]):
        with pytest.raises(NotImplementedError, match="forward mode nested in forward mode"):
            transform(w)


@FORWARD_AD
def test_operator_autograd_matches_torch(model):
    # the operators' own register_autograd (what torch.compile traces): backward, double
    # backward and the HVP's and third's backward, called through torch.ops directly
    ref = bn_loss(model)
    key = pst.handle(model)
    ops = torch.ops.pysharp
    w, v, g = points(model, 3, seed=17)
    x = w.clone().requires_grad_()
    (gx,) = torch.autograd.grad(ops.loss_and_grad(key, x)[0], x, create_graph=True)
    np.testing.assert_array_equal(gx.detach().numpy(), model.grad(w.numpy()))
    (Hg,) = torch.autograd.grad((gx * g).sum(), x)
    np.testing.assert_array_equal(Hg.numpy(), model.hvp(w.numpy(), g.numpy()))
    x, y = w.clone().requires_grad_(), v.clone().requires_grad_()
    dw, dv = torch.autograd.grad((ops.hvp(key, x, y) * g).sum(), (x, y))
    ref_dw = torch.func.grad(lambda w: (torch.func.jvp(torch.func.grad(ref), (w,), (v,))[1]
                                        * g).sum())(w)
    np.testing.assert_allclose(dw.numpy(), ref_dw.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(dv.numpy(), model.hvp(w.numpy(), g.numpy()))
    (dv,) = torch.autograd.grad((ops.third(key, w, y) * g).sum(), y)
    np.testing.assert_allclose(dv.numpy(), 2 * ref_dw.numpy(), rtol=0, atol=1e-12)
    with pytest.raises(NotImplementedError, match="not differentiable in w"):
        torch.autograd.grad(ops.third(key, x, v).sum(), x)


def test_hvp_and_third_backward(model):
    ref = bn_loss(model)
    w, v, g = points(model, 3, seed=5)

    def ref_hvp(w, v):
        x = w.clone().requires_grad_()
        (gr,) = torch.autograd.grad(ref(x[None])[0], x, create_graph=True)
        return torch.autograd.grad((gr * v).sum(), x, create_graph=True)[0]

    # d/dw <H(w) v, g> = D^3L[v, g]; d/dv <H(w) v, g> = H g
    x, y = w.clone().requires_grad_(), v.clone().requires_grad_()
    (pst.hvp(model, x, y) * g).sum().backward()
    x2 = w.clone().requires_grad_()
    (ref_hvp(x2, v) * g).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(y.grad.numpy(), model.hvp(w.numpy(), g.numpy()), rtol=0,
                               atol=1e-15)
    # third: d/dv <D^3L[v, v], g> = 2 D^3L[v, g] = 2 d/dw <H v, g>
    y = v.clone().requires_grad_()
    (pst.third(model, w, y) * g).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 2 * x2.grad.numpy(), rtol=0, atol=1e-12)
    with pytest.raises(NotImplementedError, match="not differentiable in w"):
        x = w.clone().requires_grad_()
        pst.third(model, x, v).sum().backward()
    # a single v against a batch of w: the v-gradient sums over the batch
    W = points(model, 3, seed=6)
    y = v.clone().requires_grad_()
    pst.hvp(model, W, y).sum().backward()
    expect = model.hvp(W.numpy(), np.ones((3, model.dim))).sum(0)
    np.testing.assert_allclose(y.grad.numpy(), expect, rtol=0, atol=1e-13)


def test_loss_backward_is_one_kernel_call(model):
    with counted_kernel_calls(model) as calls, pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, "hvp", lambda *a, **k: pytest.fail("no HVP for a first-order grad"))
        w = points(model, 3).requires_grad_()
        pst.loss(model, w).sum().backward()
    assert len(calls) == 1


def test_compile(model):
    W = points(model, 6, seed=7)

    @torch.compile(fullgraph=True)
    def step(model, w):
        _, g = pst.loss_and_grad(model, w)
        return w - 0.1 * g - 1e-4 * w

    out = step(model, W)
    expect = W.numpy() - 0.1 * model.grad(W.numpy()) - 1e-4 * W.numpy()
    np.testing.assert_allclose(out.numpy(), expect, rtol=0, atol=1e-15)
    # another model of the same shape is not mistaken for the first
    other = ps.BNLinearRegression.synthetic(d=40, n=20, seed=9)
    out = step(other, W)
    expect = W.numpy() - 0.1 * other.grad(W.numpy()) - 1e-4 * W.numpy()
    np.testing.assert_allclose(out.numpy(), expect, rtol=0, atol=1e-15)
    # backward through a compiled loss, in one graph (the operators, not the Functions with
    # their jvp rules, which Dynamo refuses)
    w = W.clone().requires_grad_()
    torch.compile(lambda w: pst.loss(model, w).sum(), fullgraph=True)(w).backward()
    np.testing.assert_allclose(w.grad.numpy(), model.grad(W.numpy()), rtol=0, atol=1e-15)


def test_handles_are_weak():
    m = ps.Toy3D(c=3.0)
    key = pst.handle(m)
    assert torch.ops.pysharp.loss_and_grad(key, torch.ones(3))[0].shape == ()
    del m
    gc.collect()
    with pytest.raises(RuntimeError, match="no live pysharp model"):
        torch.ops.pysharp.loss_and_grad(key, torch.ones(3))


def test_input_errors(model):
    with pytest.raises(ValueError, match=r"w must have shape \(40,\) or \(B, 40\)"):
        pst.loss(model, torch.ones(39, dtype=torch.float64))
    with pytest.raises(TypeError, match="float64 or float32"):
        pst.loss(model, torch.ones(40, dtype=torch.float16))
    with pytest.raises(TypeError, match="float64 or float32"):
        pst.loss(model, torch.ones(40, dtype=torch.int64))
    with pytest.raises(TypeError, match="dtype"):
        pst.hvp(model, torch.ones(40, dtype=torch.float64), torch.ones(40))
    with pytest.raises(TypeError, match="torch.Tensor"):
        pst.loss(model, np.ones(40))
    with pytest.raises(TypeError, match="pysharp model"):
        pst.loss(object(), torch.ones(40))
    with pytest.raises(ValueError, match="zero vector"):
        pst.loss(model, torch.zeros(40, dtype=torch.float64))


@FORWARD_AD
def test_loaded_model():
    pr = example_module("phase_retrieval")
    X, y = pr.synthetic()
    model = ps.load_model(EXAMPLE_MODELS / "phase_retrieval.hpp", X=X, y=y, c=1.0)
    w = torch.tensor(model.random_point(seed=2))
    x1, x2 = w.clone().requires_grad_(), w.clone().requires_grad_()
    pst.loss(model, x1).backward()
    pr.loss_torch(x2, X, y, 1.0).backward()
    np.testing.assert_allclose(x1.grad.numpy(), x2.grad.numpy(), rtol=0, atol=1e-13)
    H = torch.autograd.functional.hessian(lambda w: pst.loss(model, w), w)
    H_ref = torch.autograd.functional.hessian(lambda w: pr.loss_torch(w, X, y, 1.0), w)
    np.testing.assert_allclose(H.numpy(), H_ref.numpy(), rtol=0, atol=1e-12)
    H = torch.func.hessian(lambda w: pst.loss(model, w))(w)
    np.testing.assert_allclose(H.numpy(), H_ref.numpy(), rtol=0, atol=1e-12)
    g = torch.func.grad(lambda w: pst.loss(model, w))(w)
    np.testing.assert_allclose(g.numpy(), x2.grad.numpy(), rtol=0, atol=1e-13)
    key = pst.handle(model)
    result = torch.library.opcheck(torch.ops.pysharp.loss_and_grad, (key, w[None].clone()))
    assert all(v == "SUCCESS" for v in result.values())


def test_vmap_is_one_kernel_call_on_the_whole_batch(model):
    W, V = points(model, 6, seed=1), points(model, 6, seed=2)
    Wn, Vn = W.numpy(), V.numpy()
    with counted_kernel_calls(model) as calls:
        L = torch.func.vmap(torch.func.vmap(lambda w: pst.loss(model, w)))(W.reshape(2, 3, -1))
    assert calls == [(6, model.dim)]
    np.testing.assert_array_equal(L.reshape(-1).numpy(), model.loss(Wn))
    vmap = torch.func.vmap
    np.testing.assert_array_equal(vmap(lambda w, v: pst.hvp(model, w, v))(W, V).numpy(),
                                  model.hvp(Wn, Vn))
    np.testing.assert_array_equal(vmap(lambda w: pst.hvp(model, w, V[0]))(W).numpy(),
                                  model.hvp(Wn, Vn[0]))
    np.testing.assert_array_equal(vmap(lambda w, v: pst.third(model, w, v))(W, V).numpy(),
                                  model.third(Wn, Vn))
    np.testing.assert_array_equal(vmap(lambda w: pst.hessian(model, w))(W).numpy(),
                                  model.hessian(Wn))
    _, G = vmap(lambda w: pst.loss_and_grad(model, w))(W)
    np.testing.assert_array_equal(G.numpy(), model.grad(Wn))
