"""``pysharp.models.check``: a model against the loss its author wrote in JAX, PyTorch or NumPy.

The model's exact kernels (loss, gradient, Hessian-vector product and the
third-order contraction D^3L[v, v]) are compared at random points with the
derivatives of an independent reference: automatic differentiation in JAX or
PyTorch (exact up to rounding), or complex-step and finite differences of a
NumPy function. The model is also checked against the identities every
scale-invariant loss obeys: <g, w> = 0, H w = -g and L(2w) = L(w), and the same
for each group of parameters where the loss is invariant per group.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._jax import x64
from ._groups import declared_group_bounds, group_bounds
from ._square_loss import SquareLossModel

_FRAMEWORKS = ("auto", "jax", "torch", "numpy")
_EPS64 = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)
#: Errors are relative to a quantity's size, but never to less than this fraction of
#: the point's natural scale (see ``check``).
_FLOOR = 1e-2
#: Tolerance = this safety factor times the derived expected error of a finite difference.
_SAFETY = 1e3

#: (key, what it is, in words) for the comparisons with the reference.
_COMPARED = (("loss", "loss"), ("gradient", "gradient"), ("hvp", "Hessian-vector product H v"),
             ("third", "third-order contraction D3L[v, v]"))
_ALL_KEYS = ("loss", "gradient", "hvp", "third", "g.w", "Hw+g", "L(2w)-L(w)",
             "group L(2w_k)-L(w)", "group g_k.w_k")


def _rounding(dtype) -> float:
    """Rounding allowance of an exact computation in ``dtype``: 3 eps^(2/3).

    1.1e-10 in float64 and 7e-5 in float32: the kernels and automatic
    differentiation are exact up to rounding, which a sum of n terms, each
    with its own cancellations, amplifies by a condition number; eps^(2/3)
    leaves room for condition numbers up to ~ eps^(-1/3) (1.6e5 in float64,
    200 in float32) while a formula error, which is of order one, stays
    far above it.
    """
    return 3.0 * float(np.finfo(np.dtype(dtype)).eps) ** (2.0 / 3.0)


# -- the reference, in its framework ----------------------------------------------------------
class _Reference:
    """The reference's loss, gradient, H v and D^3L[v, v] at one point, as float64 arrays."""

    name = ""
    method = ""
    #: Expected relative error of each quantity (before the safety factor), set per instance.
    expected: dict[str, float]

    def __init__(self, f: Callable[[Any], Any]) -> None:
        self.f = f
        self.notes: list[str] = []

    def evaluate(self, w: np.ndarray, v: np.ndarray) -> tuple[float, np.ndarray, np.ndarray,
                                                              np.ndarray]:
        raise NotImplementedError

    def evaluate_all(self, W: np.ndarray, V: np.ndarray) -> list[tuple]:
        """``evaluate`` at each point W[b] and direction V[b]."""
        return [self.evaluate(W[b], V[b]) for b in range(len(W))]

    def tolerances(self) -> dict[str, float]:
        return dict(self.expected)


def _jax_x64(jax):
    """64-bit JAX inside the block only (the XLA backend's context; ``jax`` for the callers
    that hold the module)."""
    return x64()


def _scalar_size(out) -> int:
    shape = getattr(out, "shape", None)
    if shape is None:
        return int(np.size(out))
    return int(np.prod(shape, dtype=np.int64))


def _not_scalar(out) -> ValueError:
    shape = tuple(getattr(out, "shape", np.shape(out)))
    return ValueError(f"reference(w) must return a scalar loss, but it returned "
                      f"{type(out).__name__} of shape {shape}")


class _Jax(_Reference):
    name = "jax"
    method = "jax.grad, jvp of grad, jvp of jvp of grad"

    def __init__(self, f) -> None:
        super().__init__(f)
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.eps = _EPS64
        #: ``f.derivatives(W, V)``, where the reference has it (a from_jax model's bound
        #: loss): (loss, grad, H v, D^3L[v, v]) at every point at once, compiled once
        self.batched = getattr(f, "derivatives", None)

    def _loss(self, w):
        out = self.f(w)
        if _scalar_size(out) != 1:
            raise _not_scalar(out)
        return self.jnp.reshape(out, ())

    def probe(self, w: np.ndarray) -> None:
        """Raise unless the reference is differentiable by JAX; record its precision."""
        if self.batched is not None:  # traced already; its precision is read off its values
            return
        with _jax_x64(self.jax):
            x = self.jnp.asarray(w, dtype=self.jnp.float64)
            out = self._loss(x)
            self.jax.grad(self._loss)(x)
        self._precision(out.dtype)

    def _precision(self, dtype) -> None:
        self.eps = float(np.finfo(np.dtype(dtype)).eps)
        if self.eps > _EPS64:
            self.notes.append(f"the JAX reference computes in {np.dtype(dtype).name} "
                              "(arrays it closes over were made outside 64-bit mode?); "
                              "tolerances follow that precision")

    def evaluate_all(self, W, V):
        if self.batched is None:
            return super().evaluate_all(W, V)
        try:
            with _jax_x64(self.jax):
                loss, g, hv, d3 = self.batched(W, V)
        except Exception:  # noqa: BLE001 - not batchable: point by point, as any reference
            self.batched = None
            self.probe(W[0])
            return super().evaluate_all(W, V)
        self._precision(loss.dtype)
        f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
        loss, g, hv, d3 = f64(loss), f64(g), f64(hv), f64(d3)
        return [(float(loss[b]), g[b], hv[b], d3[b]) for b in range(len(W))]

    def evaluate(self, w, v):
        jax, jnp = self.jax, self.jnp
        with _jax_x64(jax):
            x = jnp.asarray(w, dtype=jnp.float64)
            t = jnp.asarray(v, dtype=jnp.float64)
            grad = jax.grad(self._loss)
            loss, g = jax.value_and_grad(self._loss)(x)
            hv, d3 = jax.jvp(lambda y: jax.jvp(grad, (y,), (t,))[1], (x,), (t,))
            return (float(loss), np.asarray(g, dtype=np.float64),
                    np.asarray(hv, dtype=np.float64), np.asarray(d3, dtype=np.float64))

    def tolerances(self):
        return dict.fromkeys(("loss", "gradient", "hvp", "third"), _rounding(np.float64)
                             * max(1.0, (self.eps / _EPS64) ** (2.0 / 3.0)))


class _Torch(_Reference):
    name = "torch"
    method = "torch.autograd, twice and three times (double backward)"

    def __init__(self, f) -> None:
        super().__init__(f)
        import torch
        self.torch = torch
        self.eps = _EPS64

    def _loss(self, x):
        out = self.f(x)
        if _scalar_size(out) != 1:
            raise _not_scalar(out)
        if not isinstance(out, self.torch.Tensor) or not out.requires_grad:
            raise TypeError(f"reference(w) returned {type(out).__name__} without a gradient "
                            "graph (not a torch tensor computed from w)")
        return out.reshape(())

    def probe(self, w: np.ndarray) -> None:
        x = self.torch.tensor(w, dtype=self.torch.float64, requires_grad=True)
        out = self._loss(x)
        self.eps = float(self.torch.finfo(out.dtype).eps)
        if self.eps > _EPS64:
            self.notes.append(f"the torch reference computes in {out.dtype}; tolerances "
                              "follow that precision")

    def _grad(self, y, x, create_graph: bool):
        """dy/dx, zero where y does not depend on x (a polynomial's last derivatives)."""
        if not y.requires_grad:
            return self.torch.zeros_like(x)
        (d,) = self.torch.autograd.grad(y, x, create_graph=create_graph, allow_unused=True)
        return self.torch.zeros_like(x) if d is None else d

    def evaluate(self, w, v):
        torch = self.torch
        x = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        t = torch.tensor(v, dtype=torch.float64)
        loss = self._loss(x)
        g = self._grad(loss, x, True)
        hv = self._grad((g * t).sum(), x, True)  # d/dx (g . v) = H v
        d3 = self._grad((hv * t).sum(), x, False)  # d/dx (v . H v) = D3L[v, v]
        as_np = lambda a: a.detach().to(torch.float64).numpy().copy()  # noqa: E731
        return float(loss.detach()), as_np(g), as_np(hv), as_np(d3)

    tolerances = _Jax.tolerances


class _Numpy(_Reference):
    """Complex-step gradient, and central differences of it for H v and D^3L[v, v].

    Step sizes and expected errors follow from eta, the relative noise of the
    gradient: with the complex step (exact, no cancellation) eta = eps; with
    the fallback fourth-order central differences of the loss eta = eps^(4/5)
    (noise eps/t and truncation t^4 balance at t = eps^(1/5) ||w||). The central
    difference of the gradient along v with step s ||w|| has noise eta/s and
    truncation s^2/6: s = eta^(1/3), error ~ eta^(2/3) (4e-11 with the complex
    step). The second difference has noise 4 eta/s^2 and truncation s^2/12:
    s = eta^(1/4), error ~ eta^(1/2) (1.5e-8). Tolerances are these errors
    times a safety factor of 1e3 for the loss' higher derivatives (the scale
    of variation of the loss on the sphere).
    """

    name = "numpy"

    def __init__(self, f) -> None:
        super().__init__(f)
        self.complex_step = True

    def _loss(self, w) -> Any:
        out = self.f(w)
        if _scalar_size(out) != 1:
            raise _not_scalar(out)
        a = np.asarray(out)
        if a.dtype.kind not in "iufc":
            raise TypeError(f"reference(w) returned {type(out).__name__} of dtype {a.dtype}, "
                            "not a number")
        return a.reshape(())[()]

    def _real(self, w) -> float:
        return float(np.real(self._loss(np.array(w, dtype=np.float64))))

    def probe(self, w: np.ndarray) -> None:
        """Decide between the complex step and finite differences."""
        self._real(w)
        rng = np.random.default_rng(12345)
        scale = float(np.linalg.norm(w))
        reason = None
        for _ in range(2):
            v = rng.standard_normal(w.shape)
            v *= scale / np.linalg.norm(v)
            t = 1e-4
            fd = (self._real(w + t * v) - self._real(w - t * v)) / (2 * t)
            h = 1e-20
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    z = complex(self._loss(w + 1j * h * v))
            except Exception as exc:  # noqa: BLE001 - any failure means: no complex step
                reason = f"it fails on complex input ({type(exc).__name__}: {exc})"
                break
            cs = z.imag / h
            size = abs(fd) + abs(z.real) + abs(self._real(w))
            if not np.isfinite(cs) or abs(cs - fd) > 1e-5 * size + _TINY:
                reason = ("it is not complex-analytic (abs, np.linalg.norm, conjugation or a "
                          "cast to real drop the complex step): the complex-step derivative "
                          f"{cs:.6g} differs from the finite difference {fd:.6g}")
                break
        if reason is not None:
            self.complex_step = False
            self.notes.append("complex step unusable, so the gradient comes from fourth-order "
                              f"central differences of the loss and is less accurate: {reason}. "
                              "Write the loss with w @ w instead of norms to get the complex "
                              "step")

    @property
    def eta(self) -> float:
        return _EPS64 if self.complex_step else _EPS64 ** 0.8

    @property
    def method(self) -> str:  # type: ignore[override]
        g = ("complex-step gradient" if self.complex_step
             else "fourth-order finite-difference gradient")
        return f"{g}, central differences of it for H v and D3L[v, v]"

    def gradient(self, w: np.ndarray) -> np.ndarray:
        D = w.shape[0]
        norm = float(np.linalg.norm(w))
        g = np.empty(D)
        if self.complex_step:
            h = 1e-20 * norm
            for i in range(D):
                x = w.astype(np.complex128)
                x[i] += 1j * h
                g[i] = np.imag(self._loss(x)) / h
            return g
        t = _EPS64 ** 0.2 * norm
        for i in range(D):
            f = []
            for k in (1, -1, 2, -2):
                x = w.copy()
                x[i] += k * t
                f.append(self._real(x))
            g[i] = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * t)
        return g

    def evaluate(self, w, v):
        nw, nv = float(np.linalg.norm(w)), float(np.linalg.norm(v))
        g = self.gradient(w)
        s = self.eta ** (1 / 3) * nw / nv
        hv = (self.gradient(w + s * v) - self.gradient(w - s * v)) / (2 * s)
        s = self.eta ** 0.25 * nw / nv
        d3 = (self.gradient(w + s * v) - 2 * g + self.gradient(w - s * v)) / (s * s)
        return self._real(w), g, hv, d3

    def tolerances(self):
        eta = self.eta
        return {"loss": _rounding(np.float64), "gradient": max(_rounding(np.float64),
                                                               _SAFETY * eta),
                "hvp": _SAFETY * eta ** (2 / 3), "third": _SAFETY * eta ** 0.5}


_CLASSES = {"jax": _Jax, "torch": _Torch, "numpy": _Numpy}


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _resolve(reference, framework: str, w: np.ndarray) -> _Reference:
    """The reference wrapped in its framework: forced, or found by what it accepts.

    "auto" first calls the reference on a NumPy float64 array: a JAX array out
    means JAX, a torch tensor means PyTorch, a number means NumPy. A reference
    that refuses NumPy input is tried on a JAX array and then on a torch tensor
    (requiring gradients), each where installed.
    """
    if framework != "auto":
        try:
            ref = _CLASSES[framework](reference)
        except ImportError as exc:
            raise ImportError(f"framework={framework!r} but {framework} is not installed "
                              f"({exc})") from None
        ref.probe(w)
        return ref
    failures: list[str] = []
    out = None
    try:
        if "jax" in sys.modules:
            with _jax_x64(sys.modules["jax"]):
                out = reference(w.copy())
        else:
            out = reference(w.copy())
    except Exception as exc:  # noqa: BLE001 - a torch or JAX-only reference
        failures.append(f"on a NumPy array: {_describe(exc)}")
    if out is not None:
        if _scalar_size(out) != 1:
            raise _not_scalar(out)
        module = type(out).__module__.split(".")[0]
        guess = {"jax": "jax", "jaxlib": "jax", "torch": "torch"}.get(module, "numpy")
        ref = _CLASSES[guess](reference)
        ref.probe(w)
        return ref
    for name in ("jax", "torch"):
        try:
            ref = _CLASSES[name](reference)
        except ImportError:
            continue
        try:
            ref.probe(w)
        except ValueError as exc:
            if "must return a scalar" in str(exc):
                raise
            failures.append(f"on a {name} array: {_describe(exc)}")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"on a {name} array: {_describe(exc)}")
        else:
            return ref
    raise ValueError("could not evaluate reference(w) in any framework; it failed "
                     + "; ".join(failures) + ". Pass framework='jax', 'torch' or 'numpy' to "
                     "see the full error")


# -- the report -------------------------------------------------------------------------------
@dataclasses.dataclass
class CheckReport:
    """What :func:`check` measured: per quantity, the largest relative error over the
    points, its tolerance and whether it passed.

    Quantities: ``"loss"``, ``"gradient"``, ``"hvp"`` (H v), ``"third"``
    (D^3L[v, v]) against the reference; ``"g.w"``, ``"Hw+g"`` and
    ``"L(2w)-L(w)"``, the scale-invariance identities of the model itself
    (not for a square-loss model, which is not scale-invariant);
    ``"group L(2w_k)-L(w)"`` and ``"group g_k.w_k"`` where the model is checked
    per group.

    Attributes
    ----------
    framework : {"jax", "torch", "numpy"}
        The reference's framework.
    method : str
        How the reference's derivatives were computed.
    dtype : str
        The model's precision.
    points : int
        Number of random points.
    groups : int
        Number of parameter groups checked for invariance each (1: the whole w).
    errors : dict of str to float
        Largest relative error over the points, per quantity.
    tolerances : dict of str to float
    passed : dict of str to bool
    failing : dict of str to int
        Number of points out of tolerance, per quantity.
    messages : dict of str to str
        What is wrong, in words, per failed quantity.
    notes : list of str
        Caveats (a finite-difference fallback, a low-precision reference).
    group_bounds : tuple of int
        Offsets of the groups checked: group k is ``w[group_bounds[k]:group_bounds[k + 1]]``.
    """

    framework: str
    method: str
    dtype: str
    points: int
    groups: int
    errors: dict[str, float]
    tolerances: dict[str, float]
    passed: dict[str, bool]
    failing: dict[str, int]
    messages: dict[str, str]
    notes: list[str] = dataclasses.field(default_factory=list)
    group_bounds: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every quantity is within its tolerance."""
        return all(self.passed.values())

    def problems(self) -> list[str]:
        """What is wrong, one sentence per failed quantity (empty when ``ok``)."""
        return [self.messages[k] for k, good in self.passed.items() if not good]

    def __str__(self) -> str:
        head = (f"pysharp.models.check: {'ok' if self.ok else 'FAILED'} against a "
                f"{self.framework} reference ({self.method}), {self.dtype} model, "
                f"{self.points} random points")
        lines = [head]
        lines += [f"  {p}" for p in self.problems()]
        lines.append(f"  {'quantity':<20} {'max rel err':>11} {'tolerance':>10}")
        for key, err in self.errors.items():
            verdict = "ok" if self.passed[key] else "FAIL"
            lines.append(f"  {key:<20} {err:>11.2e} {self.tolerances[key]:>10.1e}  {verdict}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Raise AssertionError saying what is wrong, unless every quantity passed."""
        if not self.ok:
            raise AssertionError("\n".join(["pysharp.models.check failed:"] + self.problems()
                                           + [str(self)]))


# -- the check -------------------------------------------------------------------------------
def _validated(model, reference, points, seed, framework, rtol, groups):
    for member in ("dim", "loss_and_grad", "hvp", "third", "random_point"):
        if not hasattr(model, member):
            raise TypeError(f"model must be a pysharp model (ScaleInvariantModel); "
                            f"{type(model).__name__} has no {member!r}")
    if not callable(reference):
        raise TypeError(f"reference must be a callable reference(w) -> scalar loss, got "
                        f"{type(reference).__name__}")
    for value, name, minimum in ((points, "points", 1), (seed, "seed", 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if framework not in _FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(map(repr, _FRAMEWORKS))}, got "
                         f"{framework!r}")
    if rtol is not None:
        items = rtol.items() if isinstance(rtol, dict) else [(None, rtol)]
        for key, value in items:
            if key is not None and key not in _ALL_KEYS:
                raise ValueError(f"rtol: unknown quantity {key!r}; quantities: "
                                 f"{', '.join(_ALL_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not 0 < float(value) < np.inf:
                raise ValueError(f"rtol must be a positive number or a dict of them, got "
                                 f"{value!r}")
    if groups is not None and not _scale_invariant(model):
        raise ValueError("groups: a square-loss model is not scale-invariant, so there is no "
                         "invariance to check per group")
    if groups is not None:
        group_bounds(groups, int(model.dim))


def _scale_invariant(model) -> bool:
    """Whether the model's loss is scale-invariant (every model but a square-loss one)."""
    return not isinstance(model, SquareLossModel)


def _relative(diff: np.ndarray, size: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """|diff| / max(size, floor, tiny), NaN where anything is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        out = diff / np.maximum(np.maximum(size, floor), _TINY)
    return np.where(np.isfinite(out), out, np.nan)


def check(model, reference: Callable[[Any], Any], *, points: int = 8, seed: int = 0,
          framework: str = "auto", rtol: float | dict[str, float] | None = None,
          groups: int | list | None = None) -> CheckReport:
    """Check a model against a reference loss written in JAX, PyTorch or NumPy.

    At ``points`` random points w (``model.random_point``, rescaled to norms
    between 1/2 and 2 so that a derivative right only on the unit sphere is
    caught) and random directions v, the model's loss, gradient g, H v and
    D^3L[v, v] (``model.third``) are compared with the reference's; and,
    unless it is a square-loss model (:class:`SquareLossModel`, not
    scale-invariant), the model is checked against the identities of scale
    invariance: <g, w> = 0,
    H w = -g and L(2w) = L(w), and, where the loss is invariant per group of
    parameters, L(w with block k doubled) = L(w) and <g_k, w_k> = 0 for each
    block.

    The reference's derivatives come from automatic differentiation (JAX:
    ``jax.grad``, ``jax.jvp`` of it, ``jax.jvp`` of that, in float64 inside a
    64-bit block that leaves the global configuration as it was; PyTorch:
    double and triple backward in float64), exact up to rounding, or, for a
    NumPy reference, from a complex-step gradient (exact up to rounding;
    the reference must then be analytic: ``w @ w``, not ``np.linalg.norm``)
    with central differences of it for H v and second differences for
    D^3L[v, v]. A NumPy reference that fails on complex input falls back to
    finite differences of the loss, and the report says so.

    Relative error, per quantity: the largest over the points of
    ||a - b|| / max(||b||, floor), a the model's value and b the reference's.
    The floor keeps a quantity that happens to be near zero (the gradient near
    a minimiser) from turning rounding into a large relative error: it is 1 %
    of the point's natural scale for that derivative order, M / ||w||^k
    ||v||^(k-1) for a k-th derivative, with M = max(||g|| ||w||,
    ||H v|| ||w||^2 / ||v||, ||D^3L[v, v]|| ||w||^3 / ||v||^2) (all the
    reference's; for a scale-invariant loss each of these is independent of
    ||w||). The identities are measured the same way: ``|<g, w>| / (||w||
    max(||g||, floor))``, ``||H w + g|| / max(||g||, floor)`` and
    ``|L(2w) - L(w)| / max(|L(w)|, floor)``, with the model's own M.

    Tolerances: automatic differentiation and the model's kernels are exact
    up to rounding, allowed 3 eps^(2/3) each (1.1e-10 in float64, 7e-5 in
    float32, from the model's dtype and the reference's); finite differences
    add their derived error times 1e3 (complex-step reference: H v 3.7e-8,
    D^3L[v, v] 1.5e-5; see the NumPy reference class).

    Parameters
    ----------
    model : ScaleInvariantModel
        A built-in or loaded model; checked in its own dtype (``model.dtype``
        where it has one, else float64).
    reference : callable
        ``reference(w) -> scalar`` with w of shape (D,): the loss, in JAX,
        PyTorch or NumPy. It receives float64 arrays (complex128 for the
        complex step).
    points : int
        Number of random points, >= 1.
    seed : int
        Seed of the points and directions.
    framework : {"auto", "jax", "torch", "numpy"}
        The reference's framework. "auto" calls it on a NumPy array: a JAX
        array back means JAX, a torch tensor means PyTorch, a number means
        NumPy; a reference that refuses NumPy input is tried on a JAX array,
        then on a torch tensor.
    rtol : float or dict, optional
        Tolerance for every quantity, or a dict overriding some quantities'
        (keys as in :class:`CheckReport`); default: derived as above.
    groups : int or list, optional
        Check invariance separately on each of these contiguous blocks of w: an
        int G (G equal blocks), a list of sizes (``[30, 6]``) or a list of
        ``(start, stop)`` ranges tiling w in order (``[(0, 30), (30, 36)]``).
        Default: what the model declares (``model.group_bounds``: a loaded
        model's ``n_groups()`` and ``group_begin(k)``, the rows of a
        ``BNTwoLayerNet``), else one group (only the whole w).

    Returns
    -------
    CheckReport
        Errors, tolerances and verdicts per quantity; ``str(report)`` says in
        words what is wrong, ``report.raise_if_failed()`` raises it.

    Raises
    ------
    TypeError
        ``model`` is not a pysharp model or ``reference`` is not callable.
    ValueError
        ``points`` < 1, unknown ``framework`` or ``rtol`` key, ``groups`` that do
        not tile w (named: a gap, an overlap, the wrong total), or a reference
        that returns a non-scalar or cannot be evaluated.
    ImportError
        A forced ``framework`` that is not installed.

    Examples
    --------
    >>> model = ps.models.load_model("phase_retrieval.hpp", X=X, y=y, c=1.0)  # doctest: +SKIP
    >>> def loss(w):                                                         # doctest: +SKIP
    ...     q = (X @ w) ** 2 / (w @ w)
    ...     return 0.5 / len(y) * np.sum((q - y) ** 2)
    >>> ps.models.check(model, loss).raise_if_failed()                       # doctest: +SKIP
    """
    _validated(model, reference, points, seed, framework, rtol, groups)
    dtype = np.dtype(getattr(model, "dtype", np.float64))
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        dtype = np.dtype(np.float64)
    D = int(model.dim)
    invariant = _scale_invariant(model)
    bounds = (group_bounds(groups, D) if groups is not None else
              declared_group_bounds(model, dtype) if invariant else np.array([0, D]))
    G = len(bounds) - 1

    # Points and directions, in the model's dtype; the reference sees the same values.
    rng = np.random.default_rng([int(seed), 0xC4EC])
    norms = 2.0 ** rng.uniform(-1.0, 1.0, size=points)
    W = (np.asarray(model.random_point(batch=points, seed=int(seed)), dtype=np.float64)
         * norms[:, None]).astype(dtype)
    V = rng.standard_normal((points, D))
    V = (V / np.linalg.norm(V, axis=1, keepdims=True)).astype(dtype)
    W64, V64 = W.astype(np.float64), V.astype(np.float64)

    ref = _resolve(reference, framework, W64[0])

    # The model.
    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    loss, grad = (f64(a) for a in model.loss_and_grad(W))
    hvp, third = f64(model.hvp(W, V)), f64(model.third(W, V))

    # The reference.
    R = ref.evaluate_all(W64, V64)
    r_loss = np.array([r[0] for r in R])
    r_grad, r_hvp, r_third = (np.stack([r[k] for r in R]) for k in (1, 2, 3))

    nw = np.linalg.norm(W64, axis=1)
    nv = np.linalg.norm(V64, axis=1)
    norm = lambda a: np.linalg.norm(a, axis=1)  # noqa: E731

    def scale(g, hv, d3):
        """M per point: the natural scale of the loss' variation (see the docstring)."""
        with np.errstate(invalid="ignore", over="ignore"):
            M = np.maximum.reduce([norm(g) * nw, norm(hv) * nw ** 2 / nv,
                                   norm(d3) * nw ** 3 / nv ** 2])
        return np.where(np.isfinite(M), M, 0.0)

    M = _FLOOR * scale(r_grad, r_hvp, r_third)
    Mm = _FLOOR * scale(grad, hvp, third)
    per_point: dict[str, np.ndarray] = {
        "loss": _relative(np.abs(loss - r_loss), np.abs(r_loss), M),
        "gradient": _relative(norm(grad - r_grad), norm(r_grad), M / nw),
        "hvp": _relative(norm(hvp - r_hvp), norm(r_hvp), M * nv / nw ** 2),
        "third": _relative(norm(third - r_third), norm(r_third), M * nv ** 2 / nw ** 3),
    }
    values = {}
    if invariant:  # the identities of scale invariance, on the model alone
        hw = f64(model.hvp(W, W))
        loss2 = f64(model.loss_and_grad(W * dtype.type(2))[0])
        per_point["g.w"] = _relative(np.abs(np.sum(grad * W64, axis=1)) / nw, norm(grad),
                                     Mm / nw)
        per_point["Hw+g"] = _relative(norm(hw + grad), norm(grad), Mm / nw)
        per_point["L(2w)-L(w)"] = _relative(np.abs(loss2 - loss), np.abs(loss), Mm)
        values["L(2w)-L(w)"] = loss2 - loss
    worst_group = None
    if G > 1:
        gl, gg = np.zeros((G, points)), np.zeros((G, points))
        dl = np.zeros((G, points))
        for k in range(G):
            block = slice(int(bounds[k]), int(bounds[k + 1]))
            Wk = W.copy()
            Wk[:, block] *= dtype.type(2)
            lk = f64(model.loss_and_grad(Wk)[0])
            dl[k] = lk - loss
            gl[k] = _relative(np.abs(lk - loss), np.abs(loss), Mm)
            wk = W64[:, block]
            gg[k] = _relative(np.abs(np.sum(grad[:, block] * wk, axis=1))
                              / np.maximum(np.linalg.norm(wk, axis=1), _TINY),
                              norm(grad[:, block]), Mm / nw)
        per_point["group L(2w_k)-L(w)"] = np.nanmax(gl, axis=0) if not np.isnan(gl).all() \
            else gl[0]
        per_point["group g_k.w_k"] = np.nanmax(gg, axis=0) if not np.isnan(gg).all() else gg[0]
        worst_group = (gl, gg, dl)

    # Tolerances: the model's rounding plus the reference's error.
    model_tol = _rounding(dtype)
    tolerances = {k: model_tol + t for k, t in ref.tolerances().items()}
    for key in per_point:
        if key not in tolerances:
            tolerances[key] = model_tol
    if rtol is not None:
        if isinstance(rtol, dict):
            tolerances.update({k: float(v) for k, v in rtol.items() if k in tolerances})
        else:
            tolerances = dict.fromkeys(tolerances, float(rtol))

    errors, passed, failing, messages = {}, {}, {}, {}
    words = dict(_COMPARED)
    for key, e in per_point.items():
        tol = tolerances[key]
        bad = ~(e <= tol)  # NaN fails
        errors[key] = float(np.nan) if np.isnan(e).any() else float(np.max(e))
        passed[key] = not bad.any()
        failing[key] = int(bad.sum())
        if passed[key]:
            continue
        b = int(np.nanargmax(e)) if not np.isnan(e).all() else 0
        where = f"at {failing[key]} of {points} points"
        nan = np.isnan(e)
        if nan.any():
            messages[key] = (f"{words.get(key, key)}: not finite (model or reference) at "
                             f"{int(nan.sum())} of {points} points, e.g. w[{int(np.argmax(nan))}]")
            continue
        if key in words:
            messages[key] = (f"{words[key]} off the reference by {errors[key]:.1e} {where} "
                             f"(worst at w[{b}]; tolerance {tol:.1e})")
        elif key == "g.w":
            messages[key] = (f"not scale-invariant: <g, w> = {e[b]:.1e} ||g|| ||w|| at w[{b}] "
                             f"(the gradient must be orthogonal to w; {where})")
        elif key == "Hw+g":
            messages[key] = (f"not scale-invariant: ||H w + g|| = {e[b]:.1e} ||g|| at w[{b}] "
                             f"(H w must equal -g; {where})")
        elif key == "L(2w)-L(w)":
            messages[key] = (f"not scale-invariant: L(2w) - L(w) = {values[key][b]:.1e} at "
                             f"w[{b}] (L(w) = {loss[b]:.3g}; {where})")
        else:
            gl, gg, dl = worst_group
            table = gl if key.startswith("group L") else gg
            k = int(np.nanargmax(table[:, b]))
            block = f"group {k} of {G} (w[{bounds[k]}:{bounds[k + 1]}])"
            if key.startswith("group L"):
                messages[key] = (f"not scale-invariant in {block}: L(w with that block "
                                 f"doubled) - L(w) = {dl[k, b]:.1e} at w[{b}] ({where})")
            else:
                messages[key] = (f"not scale-invariant in {block}: <g_k, w_k> = "
                                 f"{table[k, b]:.1e} ||g_k|| ||w_k|| at w[{b}] ({where})")
    notes = list(ref.notes)
    off = [errors[k] for k, _ in _COMPARED if not passed[k]]
    if ref.name in ("jax", "torch") and dtype == np.float64 and off and \
            all(1e-9 < e < 1e-5 for e in off):
        notes.append("the derivatives are off by about float32 rounding: does the reference "
                     "close over float32 data (in JAX, jnp.asarray(X) made while 64-bit mode "
                     "is off)? Keep data as NumPy float64 arrays, or convert it inside the "
                     "function")
    return CheckReport(framework=ref.name, method=ref.method, dtype=dtype.name, points=points,
                       groups=G, errors=errors, tolerances=tolerances, passed=passed,
                       failing=failing, messages=messages, notes=notes,
                       group_bounds=tuple(int(b) for b in bounds))


__all__ = ["check", "CheckReport"]
