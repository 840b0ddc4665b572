"""Numba CPU fallback: the C++ core's kernels and engine, line for line.

Used when the compiled extension is missing. It follows the headers under
``csrc/include/pysharp`` (same jets, same BatchNorm floor, same counter-based
RNG, same Lanczos recurrence and trajectory runner), so it agrees with the C++
path to rounding. The headers stay the source of truth: change them first and
mirror the change here; ``tests/backends/test_backends.py`` compares the two.

Jets are arrays whose last axis holds K Taylor coefficients: K = 1 is a plain
value, K = 2 carries a first directional derivative (HVP), K = 3 a second
(third-order contraction). Each model is one ``*_loss_grad`` written for any K.

The trajectory engine ``run`` has the core's block structure: prange over
blocks of up to ``LANES`` trajectories, each block's state lane-interleaved,
(D, L), and advanced by the ``*_lanes_into`` kernels, which do each lane's
plain-value arithmetic (``*_into``) in the same order. A trajectory's bits
therefore do not depend on its block or position (``tests/csrc/test_lanes.py``).

Every function takes the model as one tuple of fixed types (see ``params``), so
each compiles once and caches on disk; float64 throughout.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .._engine.methods import METHODS
from .._engine.validation import SAFE_NORM2

_EPS64 = np.finfo(np.float64).eps
BN_LINREG, BN_MC, TOY3D = 0, 1, 2


def params(kind: int, *, A=None, u=None, rows=None, cols=None, scale=0.0, extra=0.0,
           m1=0, m2=0, r=0) -> tuple:
    """The model tuple (kind, A, u, rows, cols, scale, extra, m1, m2, r, A^T).

    BN linear regression: A = Xc, u, scale, extra = ||Xc||_F^2.
    BN matrix completion: rows, cols, u, scale, m1, m2, r. Toy3D: extra = c.
    A^T is a C-contiguous copy of A^T (the plain-value z = Xc w runs along its rows).
    """
    f2 = np.zeros((0, 0)) if A is None else np.ascontiguousarray(A, np.float64)
    f1 = np.zeros(0) if u is None else np.ascontiguousarray(u, np.float64)
    i1 = np.zeros(0, np.int64)
    return (int(kind), f2, f1, i1 if rows is None else np.ascontiguousarray(rows, np.int64),
            i1 if cols is None else np.ascontiguousarray(cols, np.int64), float(scale),
            float(extra), int(m1), int(m2), int(r), np.ascontiguousarray(f2.T))


# -- truncated Taylor arithmetic (core/jet.hpp) ----------------------------------------------
@njit(cache=True)
def jmul(a, b):
    K = a.shape[0]
    c = np.zeros(K)
    for k in range(K):
        s = 0.0
        for i in range(k + 1):
            s += a[i] * b[k - i]
        c[k] = s
    return c


@njit(cache=True)
def jrecip(a):
    K = a.shape[0]
    r = np.zeros(K)
    r[0] = 1.0 / a[0]
    for k in range(1, K):
        s = 0.0
        for i in range(1, k + 1):
            s += a[i] * r[k - i]
        r[k] = -s * r[0]
    return r


@njit(cache=True)
def jsqrt(a):
    K = a.shape[0]
    s = np.zeros(K)
    s[0] = np.sqrt(a[0])
    for k in range(1, K):
        acc = 0.0
        for i in range(1, k):
            acc += s[i] * s[k - i]
        s[k] = (a[k] - acc) / (2.0 * s[0])
    return s


# -- the shared BatchNorm cosine loss (core/bn_cosine.hpp) --------------------------------------
@njit(cache=True)
def bn_cosine_loss_grad(z, u, scale, floor2):
    """z (n, K) -> (ok, loss (K,), dL/dz (n, K))."""
    n, K = z.shape
    mean = np.zeros(K)
    z2 = 0.0
    for i in range(n):
        mean += z[i]
        z2 += z[i, 0] * z[i, 0]
    mean *= 1.0 / n
    zc = z - mean
    r2 = np.zeros(K)
    for i in range(n):
        r2 += jmul(zc[i], zc[i])
    noise = 8.0 * n * _EPS64
    g = np.zeros((n, K))
    loss = np.zeros(K)
    if not (r2[0] > floor2 and r2[0] > noise * noise * z2):
        return False, loss, g
    inv_r = jrecip(jsqrt(r2))
    zhat = np.zeros((n, K))
    cos = np.zeros(K)
    for i in range(n):
        zhat[i] = jmul(zc[i], inv_r)
        cos += zhat[i] * u[i]
        e = zhat[i].copy()
        e[0] -= u[i]
        loss += jmul(e, e)
    loss *= 0.5 * scale
    for i in range(n):
        t = jmul(cos, zhat[i])
        t[0] -= u[i]
        g[i] = jmul(t, inv_r) * scale
    return True, loss, g


# -- models (models/*.hpp); params are the tuples built in _numba.py -----------------------------
@njit(cache=True)
def bn_linreg_loss_grad(params, w):
    Xc, u, scale, xc_fro2 = params[1], params[2], params[5], params[6]
    n, d = Xc.shape
    w2 = 0.0
    for j in range(d):
        w2 += w[j, 0] * w[j, 0]
    err = d * _EPS64
    z = Xc @ w
    ok, loss, gz = bn_cosine_loss_grad(z, u, scale, err * err * xc_fro2 * w2)
    return ok, loss, Xc.T @ gz


@njit(cache=True)
def bn_mc_loss_grad(params, w):
    rows, cols, u, scale, m1, r = params[3], params[4], params[2], params[5], params[7], params[9]
    N = rows.shape[0]
    K = w.shape[1]
    V0 = m1 * r
    s = np.zeros((N, K))
    for k in range(N):
        for q in range(r):
            s[k] += jmul(w[rows[k] * r + q], w[V0 + cols[k] * r + q])
    ok, loss, gs = bn_cosine_loss_grad(s, u, scale, 0.0)
    g = np.zeros_like(w)
    if ok:
        for k in range(N):
            for q in range(r):
                a = rows[k] * r + q
                b = V0 + cols[k] * r + q
                g[a] += jmul(gs[k], w[b])
                g[b] += jmul(gs[k], w[a])
    return ok, loss, g


@njit(cache=True)
def toy3d_loss_grad(params, w):
    c = params[6]
    K = w.shape[1]
    g = np.zeros((3, K))
    r2 = jmul(w[0], w[0]) + jmul(w[1], w[1]) + jmul(w[2], w[2])
    if not r2[0] > 0.0:
        return False, np.zeros(K), g
    inv_r = jrecip(jsqrt(r2))
    x, y, z = jmul(w[0], inv_r), jmul(w[1], inv_r), jmul(w[2], inv_r)
    diff = x - y
    a = c * jmul(z, z)
    a[0] += 1.0
    d2 = jmul(diff, diff)
    loss = jmul(a, d2)
    q0 = 2.0 * jmul(a, diff)
    q2 = 2.0 * c * jmul(z, d2)
    radial = jmul(diff, q0) + jmul(z, q2)
    g[0] = jmul(q0 - jmul(radial, x), inv_r)
    g[1] = jmul(-q0 - jmul(radial, y), inv_r)
    g[2] = jmul(q2 - jmul(radial, z), inv_r)
    return True, loss, g


# -- plain values (K = 1) into preallocated buffers: the trajectory engine's hot path ----------
# The same arithmetic, in the same order, as the headers instantiated on a plain Real; nothing
# allocates. Each returns (ok, loss) and writes grad L(w) into g; work is scratch of
# work_size(params) reals. Where ok is False, loss and g are unspecified (as in the core).
@njit(cache=True)
def bn_cosine_into(z, u, scale, floor2, g):
    """core/bn_cosine.hpp on plain values: z (n,) -> dL/dz into g (n,); g may be z."""
    n = z.shape[0]
    mean = 0.0
    z2 = 0.0
    for i in range(n):
        mean += z[i]
        z2 += z[i] * z[i]
    mean = mean * (1.0 / n)
    r2 = 0.0
    for i in range(n):
        g[i] = z[i] - mean
        r2 += g[i] * g[i]
    noise = 8.0 * n * _EPS64
    if not (r2 > floor2 and r2 > noise * noise * z2):
        return False, 0.0
    inv_r = 1.0 / np.sqrt(r2)
    cos = 0.0
    err2 = 0.0
    for i in range(n):
        g[i] = g[i] * inv_r
        cos += g[i] * u[i]
        e = g[i] - u[i]
        err2 += e * e
    for i in range(n):
        g[i] = (cos * g[i] - u[i]) * inv_r * scale
    return True, err2 * (0.5 * scale)


@njit(cache=True)
def bn_linreg_into(params, w, g, work):
    """models/bn_linear_regression.hpp: z = Xc w, grad = Xc^T dL/dz, each sum in index order."""
    Xc, u, scale, xc_fro2 = params[1], params[2], params[5], params[6]
    n, d = Xc.shape
    w2 = 0.0
    for j in range(d):
        w2 += w[j] * w[j]
    err = d * _EPS64
    XcT = params[10]
    z = work[:n]
    for i in range(n):
        z[i] = 0.0
    for j in range(d):  # column by column: each z[i] still sums over j in order
        wj = w[j]
        for i in range(n):
            z[i] += wj * XcT[j, i]
    ok, loss = bn_cosine_into(z, u, scale, err * err * xc_fro2 * w2, z)
    if not ok:
        return False, loss
    for j in range(d):
        g[j] = 0.0
    for i in range(n):  # the rows of Xc scaled and added: each g[j] sums over i in order
        zi = z[i]
        for j in range(d):
            g[j] += zi * Xc[i, j]
    return True, loss


@njit(cache=True)
def bn_mc_into(params, w, g, work):
    """models/bn_matrix_completion.hpp on plain values."""
    rows, cols, u, scale, m1, r = params[3], params[4], params[2], params[5], params[7], params[9]
    N = rows.shape[0]
    V0 = m1 * r
    s = work[:N]
    for k in range(N):
        a = rows[k] * r
        b = V0 + cols[k] * r
        acc = 0.0
        for q in range(r):
            acc += w[a + q] * w[b + q]
        s[k] = acc
    ok, loss = bn_cosine_into(s, u, scale, 0.0, s)
    if not ok:
        return False, loss
    for i in range(w.shape[0]):
        g[i] = 0.0
    for k in range(N):
        a = rows[k] * r
        b = V0 + cols[k] * r
        gk = s[k]
        for q in range(r):
            g[a + q] += gk * w[b + q]
            g[b + q] += gk * w[a + q]
    return True, loss


@njit(cache=True)
def toy3d_into(params, w, g, work):
    """models/toy3d.hpp on plain values."""
    c = params[6]
    r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2]
    if not r2 > 0.0:
        return False, 0.0
    inv_r = 1.0 / np.sqrt(r2)
    x, y, z = w[0] * inv_r, w[1] * inv_r, w[2] * inv_r
    diff = x - y
    a = 1.0 + c * z * z
    q0 = 2.0 * a * diff
    q2 = 2.0 * c * z * diff * diff
    radial = (x - y) * q0 + z * q2
    g[0] = (q0 - radial * x) * inv_r
    g[1] = (-q0 - radial * y) * inv_r
    g[2] = (q2 - radial * z) * inv_r
    return True, a * diff * diff


@njit(cache=True)
def work_size(params):
    """Scratch reals of loss_grad_into: n for BN linear regression, N for BN-MC."""
    if params[0] == BN_LINREG:
        return params[1].shape[0]
    if params[0] == BN_MC:
        return params[3].shape[0]
    return 1


@njit(cache=True)
def loss_grad_into(params, w, g, work):
    """(ok, L(w)) of the model named by params[0]; grad L(w) into g (D,)."""
    kind = params[0]
    if kind == BN_LINREG:
        return bn_linreg_into(params, w, g, work)
    if kind == BN_MC:
        return bn_mc_into(params, w, g, work)
    return toy3d_into(params, w, g, work)


# -- lane blocks (core/lanes.hpp): the plain-value kernels for L trajectories at once ---------
# Arrays are lane-interleaved, (rows, L) C-contiguous: x[i, l] is row i of lane l, so the
# innermost loop runs over lanes and each model constant is loaded once per L lanes. Each
# lane does the arithmetic of the plain-value kernel above, in the same order (every sum in
# index order), so its bits do not depend on the block; the loops over l have no order to
# keep and vectorise. L is read from the arrays, not a constant: a constant trip count gets
# unrolled, and Numba cannot tell LLVM that the unrolled lanes' stores and loads do not
# alias, while a loop of unknown length vectorises behind one runtime overlap check.
# Kernels compute every lane: where ok[l] is False, loss[l] and g[:, l] are unspecified
# (inf or NaN under error_model="numpy", which never raises on a division by zero).
LANE_ACC = 7  # per-lane accumulator rows of the lane kernels' work, after the model's own


@njit(cache=True, error_model="numpy")
def lane_dot(a, b, out):
    """out[l] = sum_i a[i, l] b[i, l], in index order; a, b (n, L)."""
    L = out.shape[0]
    for l in range(L):
        out[l] = 0.0
    for i in range(a.shape[0]):
        for l in range(L):
            out[l] += a[i, l] * b[i, l]


SAFE_NORM2_LO, SAFE_NORM2_HI = SAFE_NORM2[np.dtype(np.float64)]


@njit(cache=True, error_model="numpy")
def unit_scale(w, norm2, s):
    """engine/trajectory.hpp's unit_scale: s[l] = 1 where norm2[l] is in the safe range, else
    the power of two that brings lane l's largest |w_i| into [1/2, 1), within 2^+-1022."""
    for l in range(s.shape[0]):
        s[l] = 1.0
        if SAFE_NORM2_LO < norm2[l] < SAFE_NORM2_HI:
            continue
        peak = 0.0
        for i in range(w.shape[0]):
            peak = max(peak, abs(w[i, l]))
        if not (0.0 < peak < np.inf):
            continue
        e = min(max(math.frexp(peak)[1], -1022), 1022)
        s[l] = math.ldexp(1.0, -e)


@njit(cache=True, error_model="numpy")
def scale_lanes(x, f):
    """x[i, l] *= f[l]."""
    for i in range(x.shape[0]):
        for l in range(f.shape[0]):
            x[i, l] *= f[l]


@njit(cache=True, error_model="numpy")
def lane_matvec_t(A, x, out):
    """out[k, l] = sum_j x[j, l] A[j, k], in index order; A (m, p), x (m, L), out (p, L)."""
    m, p = A.shape
    L = x.shape[1]
    for k in range(p):
        for l in range(L):
            out[k, l] = 0.0
    for j in range(m):
        for k in range(p):
            a = A[j, k]
            for l in range(L):
                out[k, l] += x[j, l] * a


@njit(cache=True, error_model="numpy")
def bn_cosine_lanes_into(z, u, scale, floor2, g, acc, loss, ok):
    """bn_cosine_into per lane: z (n, L) -> dL/dz into g (n, L), which may be z;
    floor2 (L,); acc (6, L) scratch; loss (L,), ok (L,) out."""
    n, L = z.shape
    mean, z2, r2, inv_r, cos, err2 = acc[0], acc[1], acc[2], acc[3], acc[4], acc[5]
    for l in range(L):
        mean[l] = 0.0
        z2[l] = 0.0
        r2[l] = 0.0
        cos[l] = 0.0
        err2[l] = 0.0
    for i in range(n):
        for l in range(L):
            mean[l] += z[i, l]
            z2[l] += z[i, l] * z[i, l]
    for l in range(L):
        mean[l] = mean[l] * (1.0 / n)
    for i in range(n):
        for l in range(L):
            g[i, l] = z[i, l] - mean[l]
            r2[l] += g[i, l] * g[i, l]
    noise = 8.0 * n * _EPS64
    for l in range(L):
        ok[l] = (r2[l] > floor2[l]) & (r2[l] > noise * noise * z2[l])
        inv_r[l] = 1.0 / np.sqrt(r2[l])
    for i in range(n):
        ui = u[i]
        for l in range(L):
            g[i, l] = g[i, l] * inv_r[l]
            cos[l] += g[i, l] * ui
            e = g[i, l] - ui
            err2[l] += e * e
    for i in range(n):
        ui = u[i]
        for l in range(L):
            g[i, l] = (cos[l] * g[i, l] - ui) * inv_r[l] * scale
    for l in range(L):
        loss[l] = err2[l] * (0.5 * scale)


@njit(cache=True, error_model="numpy")
def bn_linreg_lanes_into(params, w, g, work, loss, ok):
    """bn_linreg_into per lane: z = Xc w, grad = Xc^T dL/dz, each sum in index order."""
    Xc, XcT, u, scale, xc_fro2 = params[1], params[10], params[2], params[5], params[6]
    n, d = Xc.shape
    z, floor2, acc = work[:n], work[n], work[n + 1:]
    lane_dot(w, w, floor2)  # ||w||^2, then the floor
    err = d * _EPS64
    c = err * err * xc_fro2
    for l in range(w.shape[1]):
        floor2[l] = c * floor2[l]
    lane_matvec_t(XcT, w, z)
    bn_cosine_lanes_into(z, u, scale, floor2, z, acc, loss, ok)
    lane_matvec_t(Xc, z, g)


@njit(cache=True, error_model="numpy")
def bn_mc_lanes_into(params, w, g, work, loss, ok):
    """bn_mc_into per lane."""
    rows, cols, u, scale, m1, r = params[3], params[4], params[2], params[5], params[7], params[9]
    N = rows.shape[0]
    L = w.shape[1]
    V0 = m1 * r
    s, floor2, acc = work[:N], work[N], work[N + 1:]
    for k in range(N):
        a = rows[k] * r
        b = V0 + cols[k] * r
        for l in range(L):
            s[k, l] = 0.0
        for q in range(r):
            for l in range(L):
                s[k, l] += w[a + q, l] * w[b + q, l]
    for l in range(L):
        floor2[l] = 0.0
    bn_cosine_lanes_into(s, u, scale, floor2, s, acc, loss, ok)
    for i in range(w.shape[0]):
        for l in range(L):
            g[i, l] = 0.0
    for k in range(N):
        a = rows[k] * r
        b = V0 + cols[k] * r
        for q in range(r):
            for l in range(L):
                g[a + q, l] += s[k, l] * w[b + q, l]
                g[b + q, l] += s[k, l] * w[a + q, l]


@njit(cache=True, error_model="numpy")
def toy3d_lanes_into(params, w, g, work, loss, ok):
    """toy3d_into per lane."""
    c = params[6]
    for l in range(w.shape[1]):
        r2 = w[0, l] * w[0, l] + w[1, l] * w[1, l] + w[2, l] * w[2, l]
        ok[l] = r2 > 0.0
        inv_r = 1.0 / np.sqrt(r2)
        x, y, z = w[0, l] * inv_r, w[1, l] * inv_r, w[2, l] * inv_r
        diff = x - y
        a = 1.0 + c * z * z
        q0 = 2.0 * a * diff
        q2 = 2.0 * c * z * diff * diff
        radial = (x - y) * q0 + z * q2
        g[0, l] = (q0 - radial * x) * inv_r
        g[1, l] = (-q0 - radial * y) * inv_r
        g[2, l] = (q2 - radial * z) * inv_r
        loss[l] = a * diff * diff


@njit(cache=True, error_model="numpy")
def loss_grad_lanes_into(params, w, g, work, loss, ok):
    """loss_grad_into for a lane block: w, g (D, L); work (work_size(params) + LANE_ACC, L)
    scratch; L(w) into loss (L,), whether it is defined into ok (L,)."""
    kind = params[0]
    if kind == BN_LINREG:
        bn_linreg_lanes_into(params, w, g, work, loss, ok)
    elif kind == BN_MC:
        bn_mc_lanes_into(params, w, g, work, loss, ok)
    else:
        toy3d_lanes_into(params, w, g, work, loss, ok)


# -- counter-based RNG (engine/rng.hpp) ---------------------------------------------------------
@njit(cache=True)
def mix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def normal(seed, stream, counter, index):
    h1 = mix64(mix64(mix64(mix64(np.uint64(seed)) ^ np.uint64(stream)) ^ np.uint64(counter))
               ^ np.uint64(2 * index))
    h2 = mix64(mix64(mix64(mix64(np.uint64(seed)) ^ np.uint64(stream)) ^ np.uint64(counter))
               ^ np.uint64(2 * index + 1))
    u1 = (float(h1 >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
    u2 = (float(h2 >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)


@njit(cache=True)
def loss_grad(params, w):
    """The model named by params[0] (BN_LINREG, BN_MC, TOY3D) on the jet w (D, K)."""
    kind = params[0]
    if kind == BN_LINREG:
        return bn_linreg_loss_grad(params, w)
    if kind == BN_MC:
        return bn_mc_loss_grad(params, w)
    return toy3d_loss_grad(params, w)



@njit(cache=True)
def seeded(params, w, v, K):
    wj = np.zeros((w.shape[0], K))
    wj[:, 0] = w
    wj[:, 1] = v
    return loss_grad(params, wj)

@njit(cache=True)
def hvp1(params, w, v):
    ok, _, g = seeded(params, w, v, 2)
    return ok, g[:, 1].copy()

@njit(parallel=True, cache=True)
def batch_loss_grad(params, W):
    B, D = W.shape
    loss, G, ok = _zeros_loss_grad(B, D)  # here, np.zeros would be a parallel region each
    nwork = work_size(params)
    for b in prange(B):
        g = np.empty(D)
        work = np.empty(nwork)
        good, lb = loss_grad_into(params, W[b], g, work)
        if good:
            loss[b] = lb
            G[b] = g
        ok[b] = good
    return loss, G, ok


@njit(cache=True)
def _zeros_loss_grad(B, D):
    return np.zeros(B), np.zeros((B, D)), np.zeros(B, np.uint8)

@njit(parallel=True, cache=True)
def batch_directional(params, W, V, order):
    B, D = W.shape
    out = np.zeros((B, D))
    ok = np.zeros(B, np.uint8)
    for b in prange(B):
        good, _, g = seeded(params, W[b], V[b], order + 1)
        if good:
            out[b] = g[:, order] * (2.0 if order == 2 else 1.0)
        ok[b] = good
    return out, ok

@njit(parallel=True, cache=True)
def batch_hessian(params, W):
    B, D = W.shape
    H = np.zeros((B, D, D))
    ok = np.ones(B, np.uint8)
    for t in prange(B * D):
        b, j = t // D, t % D
        e = np.zeros(D)
        e[j] = 1.0
        good, col = hvp1(params, W[b], e)
        if not good:
            ok[b] = 0
        else:
            H[b, :, j] = col
    return H, ok

@njit(cache=True)
def random_orthonormal(q, Q, j, D, seed, stream, counter, salt, L, nL):
    for attempt in range(4):
        key = np.uint64(counter) ^ (np.uint64(salt) << np.uint64(32))
        for i in range(D):
            q[i] = normal(seed, stream, key, attempt * D + i)
        for _ in range(2):
            for l in range(nL):
                q -= np.dot(L[l], q) * L[l]
            for l in range(j):
                q -= np.dot(Q[l], q) * Q[l]
        nrm = np.sqrt(np.dot(q, q))
        if nrm > 1e-3:
            q /= nrm
            return True
    return False

@njit(cache=True)
def top_ritz(alpha, beta, m):
    T = np.zeros((m, m))
    for i in range(m):
        T[i, i] = alpha[i]
        if i + 1 < m:
            T[i, i + 1] = T[i + 1, i] = beta[i]
    return np.linalg.eigh(T)  # ascending

@njit(cache=True)
def signed_hvp(params, w, x, sign):
    ok, y = hvp1(params, w, x)
    return ok, y * sign if sign < 0 else y

@njit(cache=True)
def lanczos_run(params, w, sign, D, k, m_max, min_iter, tol, seed, stream, counter, start,
                has_start, L, nL, floor_min, salt):
    """engine/lanczos.hpp lanczos_run on sign * H(w) in the complement of L[:nL];
    returns (ok, converged, iterations, evals, evecs, resid, spread)."""
    Q = np.zeros((m_max + 1, D))
    alpha = np.zeros(m_max)
    beta = np.zeros(m_max)
    evals = np.full(k, np.nan)
    evecs = np.zeros((k, D))
    resid = np.full(k, np.nan)
    nrm = np.sqrt(np.dot(start, start)) if has_start else 0.0
    if has_start and nrm > 0:
        Q[0] = start / nrm
    elif not random_orthonormal(Q[0], Q, 0, D, seed, stream, counter, salt, L, nL):
        return False, False, 0, evals, evecs, resid, 0.0
    m = 0
    converged = False
    theta = np.zeros(1)
    Z = np.zeros((1, 1))
    small_f = 1e-12
    for j in range(m_max):
        ok, z = signed_hvp(params, w, Q[j], sign)
        if not ok:
            return False, False, m, evals, evecs, resid, 0.0
        alpha[j] = np.dot(Q[j], z)
        z -= alpha[j] * Q[j]
        if j > 0:
            z -= beta[j - 1] * Q[j - 1]
        for _ in range(2):
            for l in range(nL):
                z -= np.dot(L[l], z) * L[l]
            for l in range(j + 1):
                z -= np.dot(Q[l], z) * Q[l]
        beta[j] = np.sqrt(np.dot(z, z))
        m = j + 1
        done = m == m_max
        # lanczos_tests_at (engine/lanczos.hpp): at the cap, and every other step from min_iter
        if m >= k and (done or (m >= min_iter and (m - min_iter) % 2 == 0)):
            theta, Z = top_ritz(alpha, beta, m)
            top = np.max(np.abs(theta))
            floor = top if top > floor_min else (floor_min if floor_min > 0 else 1.0)
            allc = True
            for t in range(min(k, m)):
                if beta[j] * abs(Z[m - 1, m - 1 - t]) > tol * floor:
                    allc = False
            converged = allc
            done = done or allc
        if done:
            break
        scale_ab = abs(alpha[j]) + (beta[j - 1] if j > 0 else 0.0)
        small = small_f * (scale_ab if scale_ab > 0 else 1.0)
        if beta[j] <= small:
            beta[j] = 0.0
            if m + nL >= D or not random_orthonormal(z, Q, m, D, seed, stream, counter,
                                                     salt + m, L, nL):
                converged = True
                theta, Z = top_ritz(alpha, beta, m)
                break
        else:
            z /= beta[j]
        Q[j + 1] = z
    spread = np.max(np.abs(theta[:m]))
    for t in range(k):
        if t >= m:
            continue
        col = m - 1 - t
        evals[t] = theta[col]
        v = np.ascontiguousarray(Z[:, col]) @ Q[:m]
        v /= np.sqrt(np.dot(v, v))
        if v[np.argmax(np.abs(v))] < 0:
            v = -v
        evecs[t] = v
        ok, y = signed_hvp(params, w, v, sign)
        if not ok:
            return False, converged, m, evals, evecs, resid, spread
        resid[t] = np.sqrt(np.sum((y - evals[t] * v) ** 2))
    return True, converged, m, evals, evecs, resid, spread

_ROUND_SALT = 2048  # detail::kRoundSalt

@njit(cache=True)
def lanczos(params, w, D, k, m_max, min_iter, tol, seed, stream, counter, start, has_start,
            smallest=False):
    """engine/lanczos.hpp lanczos (locking for k > 1); returns
    (ok, converged, iterations, evals, evecs, resid)."""
    sign = -1.0 if smallest else 1.0
    none = np.zeros((0, D))
    ok, conv, iters, evals, evecs, resid, scale = lanczos_run(
        params, w, sign, D, k, m_max, min_iter, tol, seed, stream, counter, start, has_start,
        none, 0, 0.0, 0)
    if k > 1 and ok:
        rel = max(tol, 100 * _EPS64)
        m_c = min(m_max, D - k)
        settled = m_c < 1
        check_converged = settled
        for rnd in range(1, k + 2):
            if settled:
                break
            sub_ok, sub_conv, it, cval, cvec, cres, s = lanczos_run(
                params, w, sign, D, 1, m_c, min_iter, tol, seed, stream, counter, start, False,
                evecs, k, scale, _ROUND_SALT * rnd)
            iters += it
            if not sub_ok:
                ok = False
                break
            scale = max(scale, s)
            if not cval[0] > evals[k - 1] + rel * scale:
                settled = True
                check_converged = sub_conv
                break
            p = k - 1
            while p > 0 and evals[p - 1] < cval[0]:
                p -= 1
            for t in range(k - 1, p, -1):
                evals[t] = evals[t - 1]
                resid[t] = resid[t - 1]
                evecs[t] = evecs[t - 1]
            evals[p] = cval[0]
            resid[p] = cres[0]
            evecs[p] = cvec[0]
        conv = ok and settled and check_converged and np.all(resid <= tol * scale)
    if smallest:
        evals = -evals
    return ok, conv, iters, evals, evecs, resid

@njit(parallel=True, cache=True)
def batch_lanczos(params, W, k, m_max, min_iter, tol, seed, S, has_start, smallest):
    B, D = W.shape
    evals = np.zeros((B, k))
    evecs = np.zeros((B, k, D))
    resid = np.zeros((B, k))
    iters = np.zeros(B, np.int32)
    conv = np.zeros(B, np.uint8)
    ok = np.zeros(B, np.uint8)
    for b in prange(B):
        good, c, it, ev, vec, res = lanczos(params, W[b], D, k, m_max, min_iter, tol,
                                            seed, b, 0, S[b], has_start, smallest)
        evals[b], evecs[b], resid[b] = ev, vec, res
        iters[b], conv[b], ok[b] = it, c, good
    return evals, evecs, resid, iters, conv, ok

@njit(cache=True)
def _records(B, D, steps, record_every, sharpness_every, theta_every):
    """run's outputs, NaN where never reached. Serial: inside a parallel function every
    np.full would be a parallel region of its own (a thread barrier each)."""
    nan = np.nan
    nrec = steps // record_every + 1
    nsh = steps // sharpness_every + 1 if sharpness_every > 0 else 0
    nth = steps // theta_every + 1 if theta_every > 0 else 0
    return (np.full((nrec, B), nan), np.full((nrec, B), nan), np.full((nrec, B), nan),
            np.full((nrec, B), nan), np.full((nrec, B), nan), np.full((nsh, B), nan),
            np.full((nsh, B), nan), np.zeros((nsh, B), np.uint8), np.full((nth, B, D), nan),
            np.zeros((B, D)), np.zeros(B, np.uint8), np.full(B, -1, np.int64))


#: Trajectories per lane block of ``run``. On AVX2, LLVM vectorises a lane loop 4 wide,
#: unrolled 4 times, so below 16 lanes it runs scalar; 32 amortises each loop's overlap
#: check (BN linear regression d 40, B 4096, against one trajectory per prange iteration in
#: the same process: 8 lanes 0.85x, 16 1.6x, 32 2.0x, 64 2.1x) while a batch of 256 still
#: makes 8 blocks for the threads.
LANES = 32

# The method codes the engine loop branches on (compile-time constants to Numba).
_PGD, _PGD_ADAPTIVE = METHODS["pgd"].code, METHODS["pgd_adaptive"].code
_SCALAR_RMSPROP = METHODS["scalar_rmsprop"].code


@njit(parallel=True, cache=True, error_model="numpy")
def run(params, W0, rate, lr, wd, method, steps, record_every, sharpness_every, theta_every,
        jitter, seed, offset, rms_beta, rms_eps, m_max, min_iter, tol):
    """engine/trajectory.hpp: TrajectoryRunner.observe / step / finish on lane blocks.

    rate (B,) is the step size (the method's lr, or eta on the sphere); lr and wd (B,) give
    the decay factor 1 - lr wd (zeros for a method without weight decay).

    prange runs over blocks of up to LANES trajectories; a block's iterate, gradient,
    next iterate and model scratch are (rows, L) lane-interleaved arrays, allocated once
    and updated in place (``loss_grad_lanes_into``). The last block's padding lanes
    repeat its first trajectory and are never recorded. A lane that diverges is flagged
    and frozen (its records stay NaN) while the block runs on; each lane's arithmetic is
    that of a lone trajectory. Lanczos (jets) runs lane by lane at sharpness steps.
    """
    B, D = W0.shape
    (loss_r, norm2_r, eff_r, gn_r, top_r, sharp_r, ratio_r, conv_r, theta_r, w_out, diverged,
     div_step) = _records(B, D, steps, record_every, sharpness_every, theta_every)
    sphere = method == _PGD or method == _PGD_ADAPTIVE  # the port's methods on the sphere
    nwork = work_size(params) + LANE_ACC
    L = max(1, min(LANES, B))
    for blk in prange((B + L - 1) // L):
        b0 = blk * L
        lanes = min(L, B - b0)
        w = np.empty((D, L))
        g = np.empty((D, L))
        nxt = np.empty((D, L))
        work = np.empty((nwork, L))
        per_lane = np.empty((11, L))
        loss, norm2, gnorm2, norm = per_lane[0], per_lane[1], per_lane[2], per_lane[3]
        eff, step, n_next, bad = per_lane[4], per_lane[5], per_lane[6], per_lane[7]
        # norm2, gnorm2 and norm are those of sc w (sc = 1 but at extreme norms), as in C++
        sc, inv_sc, norm2_w = per_lane[8], per_lane[9], per_lane[10]
        ok = np.empty(L, np.bool_)
        live = np.empty(L, np.bool_)
        traj = np.empty(L, np.int64)
        lr_l, decay, eta, rms_v = np.empty(L), np.empty(L), np.empty(L), np.zeros(L)
        v1 = np.zeros((L, D))
        have_v1 = np.zeros(L, np.bool_)
        w_lane, start = np.empty(D), np.empty(D)  # one lane's point and warm start
        for l in range(L):
            b = b0 + (l if l < lanes else 0)  # padding repeats the block's first lane
            traj[l] = offset + b
            lr_l[l] = rate[b]
            decay[l] = 1.0 - lr[b] * wd[b]
            eta[l] = rate[b]
            live[l] = l < lanes
            for i in range(D):
                w[i, l] = W0[b, i]
        rec = 0
        sh = 0
        th = 0
        for t in range(steps + 1):
            # observe(t)
            lane_dot(w, w, norm2)
            unit_scale(w, norm2, sc)
            rescaled = False
            for l in range(L):
                rescaled = rescaled or sc[l] != 1.0
            if rescaled:
                for l in range(L):
                    inv_sc[l] = 1.0 / sc[l]
                scale_lanes(w, sc)
                lane_dot(w, w, norm2)
            loss_grad_lanes_into(params, w, g, work, loss, ok)
            lane_dot(g, g, gnorm2)
            if rescaled:
                scale_lanes(w, inv_sc)
                scale_lanes(g, sc)  # grad L(w) = s grad L(s w)
            for l in range(lanes):
                if live[l] and not (ok[l] and np.isfinite(loss[l]) and np.isfinite(gnorm2[l])
                                    and np.isfinite(norm2[l])):
                    live[l] = False
                    diverged[b0 + l] = 1
                    div_step[b0 + l] = t
            if not live.any():
                break
            for l in range(L):
                norm[l] = np.sqrt(norm2[l])
                norm2_w[l] = norm2[l] / sc[l] / sc[l]
                if sphere:
                    eff[l] = eta[l]
                elif method == _SCALAR_RMSPROP:
                    rms_v[l] = rms_beta * rms_v[l] + (1.0 - rms_beta) * (gnorm2[l] * sc[l] * sc[l])
                    eff[l] = lr_l[l] / ((np.sqrt(rms_v[l]) + rms_eps) * decay[l] * norm2_w[l])
                else:
                    eff[l] = lr_l[l] / (decay[l] * norm2_w[l])
            sharp_step = sharpness_every > 0 and t % sharpness_every == 0
            record = t % record_every == 0
            snapshot = theta_every > 0 and t % theta_every == 0
            for l in range(lanes):
                if not live[l]:
                    continue
                b = b0 + l
                if sharp_step:
                    for i in range(D):
                        w_lane[i] = w[i, l] * sc[l]
                        start[i] = v1[l, i]
                    lz_ok, c, _, ev, vec, _ = lanczos(params, w_lane, D, 1, m_max, min_iter,
                                                      tol, seed, traj[l], t, start, have_v1[l])
                    if not lz_ok or not np.isfinite(ev[0]):
                        live[l] = False
                        diverged[b] = 1
                        div_step[b] = t
                        continue
                    flip = -1.0 if have_v1[l] and np.dot(vec[0], start) < 0 else 1.0
                    for i in range(D):
                        v1[l, i] = flip * vec[0, i]
                    have_v1[l] = True
                    sharp = ev[0] * norm2[l]
                    sharp_r[sh, b] = sharp
                    ratio_r[sh, b] = eff[l] * sharp
                    conv_r[sh, b] = c
                if record:
                    loss_r[rec, b] = loss[l]
                    norm2_r[rec, b] = norm2_w[l]
                    eff_r[rec, b] = eff[l]
                    gn_r[rec, b] = norm[l] * np.sqrt(gnorm2[l])
                    if have_v1[l]:
                        s = 0.0
                        for i in range(D):
                            s += v1[l, i] * g[i, l]
                        top_r[rec, b] = norm[l] * (s / sc[l])
                if snapshot:
                    for i in range(D):
                        theta_r[th, b, i] = w[i, l] * sc[l] / norm[l]
            if sharp_step:
                sh += 1
            if record:
                rec += 1
            if snapshot:
                th += 1
            if t == steps:
                break
            # step(t)
            for l in range(L):
                if sphere:
                    step[l] = eta[l] * (norm[l] / sc[l])
                else:
                    rms = method == _SCALAR_RMSPROP
                    step[l] = lr_l[l] / (np.sqrt(rms_v[l]) + rms_eps) if rms else lr_l[l]
            for i in range(D):
                for l in range(L):
                    if sphere:
                        nxt[i, l] = w[i, l] / (norm[l] / sc[l]) - step[l] * g[i, l]
                    else:
                        nxt[i, l] = decay[l] * w[i, l] - step[l] * g[i, l]
            if jitter > 0:
                for l in range(lanes):
                    if live[l]:
                        amp = jitter * (norm[l] / sc[l]) / np.sqrt(D)
                        for i in range(D):
                            nxt[i, l] += amp * normal(seed, traj[l], t, i)
            if sphere:
                lane_dot(nxt, nxt, n_next)
                for l in range(L):
                    n_next[l] = np.sqrt(n_next[l])
                for i in range(D):
                    for l in range(L):
                        nxt[i, l] /= n_next[l]
            for l in range(L):
                bad[l] = 0.0  # sums x - x: 0 where every coordinate is finite, else NaN
            for i in range(D):
                for l in range(L):
                    bad[l] += nxt[i, l] - nxt[i, l]
            for l in range(lanes):
                if live[l] and not bad[l] == 0.0:
                    live[l] = False
                    diverged[b0 + l] = 1
                    div_step[b0 + l] = t + 1
            for l in range(L):  # lanes that do not move keep w
                if not live[l]:
                    for i in range(D):
                        nxt[i, l] = w[i, l]
            w, nxt = nxt, w
            if method == _PGD_ADAPTIVE:
                for l in range(L):
                    eta[l] = 1.0 / (decay[l] * decay[l] * (1.0 / eta[l] + eta[l] * norm2[l]
                                                           * gnorm2[l]))
        for l in range(lanes):
            for i in range(D):
                w_out[b0 + l, i] = w[i, l]
    return (loss_r, norm2_r, eff_r, gn_r, top_r, sharp_r, ratio_r, conv_r, theta_r, w_out,
            diverged, div_step)
