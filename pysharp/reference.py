"""NumPy reference implementations of the models: the test oracles.

Written for clarity, not speed, and independently of the C++ core: the loss
comes straight from the model definitions in docs/theory.rst, section "The
models" (predictions, then mean squared error), the gradient and
Hessian-vector product from hand derivations, and the third-order contraction D^3L(w)[v, v] from a
complex-step derivative of the analytic HVP, exact to rounding. Every
function takes a batch ``w`` of shape (B, D) (and ``v`` of the same shape)
and works on float64 or complex128 input.

Do not use these for speed: they allocate freely and run several times
slower than ``pysharp.models``.
"""

from __future__ import annotations

import numpy as np


def _dot(a, b):
    """Row-wise a . b without conjugation, so complex steps stay analytic."""
    return np.sum(a * b, axis=-1, keepdims=True)


def _unit(z):
    return z / np.sqrt(_dot(z, z))


def complex_step(f, w, v, h: float = 1e-30):
    """Directional derivative d/dt f(w + t v) at t = 0, by the complex step.

    ``f`` must be analytic (no abs, no conjugation) in its first argument.
    """
    return np.imag(f(w + 1j * h * v)) / h


def bn_cosine_hvp(zc, u, scale, vc):
    """Hessian-vector product of L(z) = scale (1 - u . zc/||zc||) in z.

    zc and vc are centred (B, n); u is the unit centred target. Derivation:
    with r = ||zc||, zh = zc/r, f = u . zh, a = zh . v, c = u . v,
    H v = (scale / r^2) [zh (c - 3 f a) + a u + f v].
    """
    r2 = _dot(zc, zc)
    zh = zc / np.sqrt(r2)
    f, a, c = _dot(zh, u), _dot(zh, vc), _dot(u, vc)
    return scale / r2 * (zh * (c - 3 * f * a) + a * u + f * vc)


class BNLinearRegressionReference:
    """Oracle for ``pysharp.models.BNLinearRegression``."""

    def __init__(self, X, y):
        self.X = np.asarray(X, dtype=float)
        self.y = np.asarray(y, dtype=float)
        self.Xc = self.X - self.X.mean(axis=0)
        yc = self.y - self.y.mean()
        self.u = yc / np.linalg.norm(yc)
        self.scale = 2 * self.y.var()

    def predictions(self, w):
        z = w @ self.Xc.T
        sigma = np.sqrt(np.mean(z * z, axis=-1, keepdims=True))
        return self.y.std() * z / sigma + self.y.mean()

    def loss(self, w):
        return np.mean((self.predictions(w) - self.y) ** 2, axis=-1)

    def grad(self, w):
        z = w @ self.Xc.T
        r = np.sqrt(_dot(z, z))
        zh = z / r
        dz = -self.scale * (self.u - _dot(zh, self.u) * zh) / r
        return dz @ self.Xc

    def hvp(self, w, v):
        return bn_cosine_hvp(w @ self.Xc.T, self.u, self.scale, v @ self.Xc.T) @ self.Xc

    def third(self, w, v):
        return complex_step(lambda x: self.hvp(x, v), w, v)


class BNMatrixCompletionReference:
    """Oracle for ``pysharp.models.BNMatrixCompletion``."""

    def __init__(self, rows, cols, values, shape, rank):
        self.rows = np.asarray(rows)
        self.cols = np.asarray(cols)
        self.values = np.asarray(values, dtype=float)
        self.m1, self.m2 = shape
        self.r = rank
        vc = self.values - self.values.mean()
        self.u = vc / np.linalg.norm(vc)
        self.scale = 2 * self.values.var()

    def factors(self, w):
        B = w.shape[0]
        U = w[:, : self.m1 * self.r].reshape(B, self.m1, self.r)
        V = w[:, self.m1 * self.r :].reshape(B, self.m2, self.r)
        return U, V

    def scores(self, w, rows=None, cols=None):
        rows = self.rows if rows is None else rows
        cols = self.cols if cols is None else cols
        U, V = self.factors(w)
        return np.sum(U[:, rows] * V[:, cols], axis=-1)

    def loss(self, w):
        s = self.scores(w)
        p = self.values.std() * (s - s.mean(-1, keepdims=True)) / s.std(-1, keepdims=True)
        return np.mean((p + self.values.mean() - self.values) ** 2, axis=-1)

    def test_loss(self, w, rows, cols, values):
        s = self.scores(w)
        mu, sd = s.mean(-1, keepdims=True), s.std(-1, keepdims=True)
        p = self.values.std() * (self.scores(w, rows, cols) - mu) / sd + self.values.mean()
        return np.mean((p - values) ** 2, axis=-1)

    def _pullback(self, w, h_s, dw=None):
        """J(w)^T h_s: scatter per-entry weights back onto U and V rows.

        With ``dw`` given, returns J1^T h_s instead, the same scatter with the
        factors of ``dw`` (the derivative of J along dw; s is bilinear).
        """
        U, V = self.factors(w if dw is None else dw)
        dtype = np.result_type(h_s, U)
        gU = np.zeros(U.shape, dtype)
        gV = np.zeros(V.shape, dtype)
        for b in range(w.shape[0]):
            np.add.at(gU[b], self.rows, h_s[b, :, None] * V[b, self.cols])
            np.add.at(gV[b], self.cols, h_s[b, :, None] * U[b, self.rows])
        return np.concatenate([gU.reshape(w.shape[0], -1), gV.reshape(w.shape[0], -1)], axis=1)

    def _ds(self, w, v):
        """Directional derivative of the scores, J(w) v."""
        U, V = self.factors(w)
        dU, dV = self.factors(v)
        return np.sum(dU[:, self.rows] * V[:, self.cols] + U[:, self.rows] * dV[:, self.cols], -1)

    def _grad_scores(self, w):
        s = self.scores(w)
        sc = s - s.mean(-1, keepdims=True)
        r = np.sqrt(_dot(sc, sc))
        sh = sc / r
        return -self.scale * (self.u - _dot(sh, self.u) * sh) / r

    def grad(self, w):
        return self._pullback(w, self._grad_scores(w))

    def hvp(self, w, v):
        s = self.scores(w)
        s1 = self._ds(w, v)
        center = lambda x: x - x.mean(-1, keepdims=True)  # noqa: E731
        h = bn_cosine_hvp(center(s), self.u, self.scale, center(s1))
        return self._pullback(w, h) + self._pullback(w, self._grad_scores(w), dw=v)

    def third(self, w, v):
        return complex_step(lambda x: self.hvp(x, v), w, v)


class Toy3DReference:
    """Oracle for ``pysharp.models.Toy3D``: L = g(w/||w||) with a cubic-free g."""

    def __init__(self, c=10.0):
        self.c = float(c)

    def _g_derivatives(self, t):
        """Gradient q (B, 3) and Hessian G (B, 3, 3) of g(x, y, z) = (1 + c z^2)(x - y)^2."""
        x, y, z = t[:, 0], t[:, 1], t[:, 2]
        c, d = self.c, x - y
        a = 1 + c * z * z
        q = np.stack([2 * a * d, -2 * a * d, 2 * c * z * d * d], axis=1)
        G = np.zeros(t.shape[:1] + (3, 3), dtype=t.dtype)
        G[:, 0, 0] = G[:, 1, 1] = 2 * a
        G[:, 0, 1] = G[:, 1, 0] = -2 * a
        G[:, 0, 2] = G[:, 2, 0] = 4 * c * z * d
        G[:, 1, 2] = G[:, 2, 1] = -4 * c * z * d
        G[:, 2, 2] = 2 * c * d * d
        return q, G

    def loss(self, w):
        t = _unit(w)
        return (1 + self.c * t[:, 2] ** 2) * (t[:, 0] - t[:, 1]) ** 2

    def grad(self, w):
        r = np.sqrt(_dot(w, w))
        t = w / r
        q, _ = self._g_derivatives(t)
        return (q - _dot(t, q) * t) / r

    def hvp(self, w, v):
        """(1/r^2) [P G P v - t (q . P v) - (t . q) P v - P q (t . v)], P = I - t t^T."""
        r2 = _dot(w, w)
        t = w / np.sqrt(r2)
        q, G = self._g_derivatives(t)
        Pv = v - _dot(t, v) * t
        GPv = np.einsum("bij,bj->bi", G, Pv)
        PGPv = GPv - _dot(t, GPv) * t
        Pq = q - _dot(t, q) * t
        return (PGPv - t * _dot(q, Pv) - _dot(t, q) * Pv - Pq * _dot(t, v)) / r2

    def third(self, w, v):
        return complex_step(lambda x: self.hvp(x, v), w, v)
