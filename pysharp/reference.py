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

import sys

import numpy as np


def _xp(a):
    """The array namespace of ``a``: ``jax.numpy`` for JAX arrays and tracers, else NumPy.

    The losses (not the hand-derived derivatives) are written against it, so that the
    XLA backend (``pysharp._backends._jax``) differentiates these same definitions.
    """
    return sys.modules["jax.numpy"] if type(a).__module__.startswith("jax") else np


def _dot(a, b):
    """Row-wise a . b without conjugation, so complex steps stay analytic."""
    return _xp(a).sum(a * b, axis=-1, keepdims=True)


def _unit(z):
    return z / _xp(z).sqrt(_dot(z, z))


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
        xp = _xp(w)
        z = w @ self.Xc.T
        sigma = xp.sqrt(xp.mean(z * z, axis=-1, keepdims=True))
        return self.y.std() * z / sigma + self.y.mean()

    def loss(self, w):
        return _xp(w).mean((self.predictions(w) - self.y) ** 2, axis=-1)

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
        return _xp(w).sum(U[:, rows] * V[:, cols], axis=-1)

    def loss(self, w):
        s = self.scores(w)
        p = self.values.std() * (s - s.mean(-1, keepdims=True)) / s.std(-1, keepdims=True)
        return _xp(w).mean((p + self.values.mean() - self.values) ** 2, axis=-1)

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


class BNTwoLayerNetReference:
    r"""Oracle for a two-layer network with BatchNorm on the hidden pre-activations.

    With W of shape (m, d) (``w = W.ravel()``, row-major, D = m d),
    z_ij = W_j . x_i, zhat_ij = (z_ij - mean_i z_ij) / std_i z_ij (population
    std, no affine), f(x_i) = sum_j a_j act(zhat_ij) with fixed output weights
    a_j = (-1)^j / sqrt(m), and L = mean_i (f(x_i) - y_i)^2. L is invariant to
    the positive scale of each row W_j.

    Derivation (per unit j; Xc = X - mean(X), c_j = Xc W_j, r_j = ||c_j||,
    chat_j = c_j / r_j, zhat_j = sqrt(n) chat_j, all dot products unconjugated)::

        q_ij = (2/n) (f_i - y_i) a_j act'(zhat_ij),
        g_j = sqrt(n)/r_j (q_j - (chat_j . q_j) chat_j),   grad_j = Xc^T g_j.

    Along v (V_j its rows, s_j = Xc V_j, e_j = chat_j . s_j,
    dzhat_j = sqrt(n)/r_j (s_j - e_j chat_j), df_i = sum_j a_j act'(zhat_ij) dzhat_ij)::

        dq_ij = (2/n) a_j [df_i act'(zhat_ij) + (f_i - y_i) act''(zhat_ij) dzhat_ij],
        Hv_j = Xc^T sqrt(n)/r_j [dq_j - (chat_j . dq_j) chat_j
               - (e_j q_j + (s_j . q_j) chat_j + (chat_j . q_j) s_j
                  - 3 e_j (chat_j . q_j) chat_j) / r_j].

    Centring q (or dq) is not needed: chat_j and s_j are centred and Xc^T 1 = 0.
    """

    def __init__(self, X, y, width, activation: str = "tanh"):
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if X.ndim != 2 or X.shape[0] < 2:
            raise ValueError(f"X must be 2-D (n, d) with n >= 2, got shape {X.shape}")
        if y.shape != (X.shape[0],):
            raise ValueError(f"y must have shape ({X.shape[0]},), got {y.shape}")
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
            raise ValueError(f"width must be an int >= 1, got {width!r}")
        if activation not in ("tanh", "relu"):
            raise ValueError(f"activation must be 'tanh' or 'relu', got {activation!r}")
        self.X, self.y = X, y
        self.n, self.d = X.shape
        self.m = int(width)
        self.dim = self.m * self.d
        self.activation = activation
        self.Xc = X - X.mean(axis=0)
        self.a = np.where(np.arange(self.m) % 2 == 0, 1.0, -1.0) / np.sqrt(self.m)

    def _act(self, x, order: int):
        """act (order 0), act' (1) or act'' (2), analytic for complex x away from relu's kink."""
        xp = _xp(x)
        if self.activation == "tanh":
            t = xp.tanh(x)
            return (t, 1 - t * t, -2 * t * (1 - t * t))[order]
        pos = xp.real(x) > 0
        return (xp.where(pos, x, 0), xp.where(pos, 1.0, 0.0), xp.zeros_like(x))[order]

    def _rows(self, w):
        return w.reshape(w.shape[0], self.m, self.d)

    def _forward(self, w):
        """Centred pre-activations: chat (B, m, n), r (B, m, 1), zhat, residual f - y (B, n)."""
        c = np.einsum("bjk,ik->bji", self._rows(w), self.Xc)
        r = np.sqrt(_dot(c, c))
        chat = c / r
        zhat = np.sqrt(self.n) * chat
        f = np.einsum("j,bji->bi", self.a, self._act(zhat, 0))
        return chat, r, zhat, f - self.y

    def predictions(self, w):
        """f(x_i) for each row of w (B, D): (B, n), from uncentred X and per-unit statistics."""
        xp = _xp(w)
        z = xp.einsum("bjk,ik->bji", self._rows(w), self.X)
        c = z - z.mean(axis=-1, keepdims=True)
        std = xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True))
        return xp.einsum("j,bji->bi", self.a, self._act(c / std, 0))

    def loss(self, w):
        """L(w), (B,)."""
        return _xp(w).mean((self.predictions(w) - self.y) ** 2, axis=-1)

    def grad(self, w):
        """Gradient, (B, D)."""
        chat, r, zhat, res = self._forward(w)
        q = (2 / self.n) * res[:, None, :] * self.a[:, None] * self._act(zhat, 1)
        g = np.sqrt(self.n) / r * (q - _dot(chat, q) * chat)
        return (g @ self.Xc).reshape(w.shape[0], -1)

    def hvp(self, w, v):
        """Hessian-vector product H(w) v, (B, D); analytic in w."""
        chat, r, zhat, res = self._forward(w)
        s = np.einsum("bjk,ik->bji", self._rows(v), self.Xc)
        e = _dot(chat, s)
        dzhat = np.sqrt(self.n) / r * (s - e * chat)
        act1 = self._act(zhat, 1)
        df = np.einsum("j,bji->bi", self.a, act1 * dzhat)
        q = (2 / self.n) * res[:, None, :] * self.a[:, None] * act1
        dq = (2 / self.n) * self.a[:, None] * (
            df[:, None, :] * act1 + res[:, None, :] * self._act(zhat, 2) * dzhat
        )
        kappa = _dot(chat, q)
        dg = np.sqrt(self.n) / r * (
            dq - _dot(chat, dq) * chat
            - (e * q + _dot(s, q) * chat + kappa * s - 3 * e * kappa * chat) / r
        )
        return (dg @ self.Xc).reshape(w.shape[0], -1)

    def third(self, w, v):
        """D^3L(w)[v, v] = d/dt H(w + t v) v, (B, D), by the complex step."""
        return complex_step(lambda x: self.hvp(x, v), w, v)
