"""Square-loss networks in XLA: per-sample Jacobians, their products, and mini-batch SGD.

A model reaches this module as a pure JAX prediction of the flat parameters for ONE
sample, ``pred(w (D,), x) -> (k,)``, and its data X (n, ...), Y (n, k). Everything that
touches all n samples runs over fixed-size chunks of ``chunk`` samples (the last one padded
and masked), so a FashionMNIST-sized n never materialises more than one chunk's per-sample
Jacobian (chunk, k, D) at once; one compiled program serves every chunk.

- the per-sample Jacobians J_i = d pred(w, x_i) / dw by ``vmap(jacrev)``, and the input
  gradients d pred / dx likewise;
- the matrix-free products of the SGD stability theory, one pass over the data each, by
  jvp and vjp (no Jacobian formed): sum_i J_i^T J_i V (n H V) and
  sum_i J_i^T (J_i J_i^T) J_i V (n mean_i H_i^2 V);
- loss and gradient of L = (1/2n) sum_i ||pred(w, x_i) - y_i||^2;
- mini-batch SGD (:func:`run_sgd`), T trajectories vmapped, the steps between two
  recorded steps one jitted ``fori_loop``, over batches the caller draws (the compiled
  core's, ``pysharp.sgd.sgd_batches``), with the compiled engine's divergence rules.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np

from ._jax import _check_memory, _jax, x64


class SquareLossKernels:
    """The chunked kernels of one square-loss network in float64.

    Parameters
    ----------
    pred : callable
        ``pred(w, x) -> (k,)``: the prediction for one sample x of shape ``X.shape[1:]``.
    X : ndarray, shape (n, ...)
        Inputs.
    Y : ndarray, shape (n, k)
        Targets.
    dim : int
        D, the length of w.
    chunk : int
        Samples per chunk (1 <= chunk <= n).
    """

    def __init__(self, pred: Callable, X: np.ndarray, Y: np.ndarray, dim: int,
                 chunk: int) -> None:
        jax, jnp = _jax()
        self._pred = pred
        self.n, self.k = Y.shape
        self.dim = int(dim)
        self.chunk = int(chunk)
        self.n_chunks = -(-self.n // self.chunk)
        pad = self.n_chunks * self.chunk - self.n
        mask = np.concatenate([np.ones(self.n), np.zeros(pad)])
        # padding repeats sample 0 (a valid input); its weight is 0
        Xp = np.concatenate([X, np.repeat(X[:1], pad, axis=0)]) if pad else X
        Yp = np.concatenate([Y, np.repeat(Y[:1], pad, axis=0)]) if pad else Y
        with x64():
            self.X = jnp.asarray(Xp.reshape((self.n_chunks, self.chunk) + X.shape[1:]))
            self.Y = jnp.asarray(Yp.reshape(self.n_chunks, self.chunk, self.k))
            self.mask = jnp.asarray(mask.reshape(self.n_chunks, self.chunk))
        self.X_flat = X  # the host copy, for SGD

    @cached_property
    def _fns(self) -> dict[str, Callable]:
        jax, jnp = _jax()
        pred = self._pred
        over = jax.vmap(pred, in_axes=(None, 0))

        def jac(w, Xc):
            return over(w, Xc), jax.vmap(jax.jacrev(pred), in_axes=(None, 0))(w, Xc)

        def products(w, V, Xc, m):
            # matrix-free: J v by jvp, J^T u by vjp, and G_i u_i = J_i (J_i^T u_i) by a
            # per-sample vjp then jvp; memory (chunk, D) per vector, no (chunk, k, D)
            def f(w):
                return over(w, Xc)
            _, back = jax.vjp(f, w)

            def one(v):
                U = jax.jvp(f, (w,), (v,))[1] * m[:, None]  # J_i v
                T = jax.vmap(lambda x, u: jax.vjp(lambda w: pred(w, x), w)[1](u)[0])(Xc, U)
                GU = jax.vmap(lambda x, t: jax.jvp(lambda w: pred(w, x), (w,), (t,))[1])(Xc, T)
                return back(U)[0], back(GU * m[:, None])[0]
            return jax.lax.map(one, V)

        def gauss_newton(w, V, Xc, m):
            def f(w):
                return over(w, Xc)
            _, back = jax.vjp(f, w)
            return jax.lax.map(lambda v: back(jax.jvp(f, (w,), (v,))[1] * m[:, None])[0], V)

        def loss_grad(w, Xc, Yc, m):
            def f(w):
                r = over(w, Xc) - Yc
                return 0.5 * jnp.sum(m[:, None] * r * r)
            return jax.value_and_grad(f)(w)

        def moments(w, Xc, m, k):
            J = jax.vmap(jax.jacrev(pred), in_axes=(None, 0))(w, Xc)
            return jnp.sum(m * jnp.sum(J ** (2 * k), axis=(1, 2)))

        def input_moments(w, Xc, m, k):
            G = jax.vmap(jax.jacrev(pred, argnums=1), in_axes=(None, 0))(w, Xc)
            return jnp.sum(m * jnp.sum((G ** (2 * k)).reshape(G.shape[0], -1), axis=1))

        return {"jac": jax.jit(jac), "input_moments": jax.jit(input_moments, static_argnums=3),
                "input_jac": jax.jit(jax.vmap(jax.jacrev(pred, argnums=1), in_axes=(None, 0))),
                "products": jax.jit(products), "gauss_newton": jax.jit(gauss_newton),
                "loss_grad": jax.jit(loss_grad),
                "moments": jax.jit(moments, static_argnums=3)}

    def _chunks(self):
        for j in range(self.n_chunks):
            lo = j * self.chunk
            yield lo, min(lo + self.chunk, self.n), j

    # -- one point w (D,) float64 each --------------------------------------------------------
    def loss_grad(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        _, jnp = _jax()
        total, g = 0.0, np.zeros(self.dim)
        with x64():
            wj = jnp.asarray(w, dtype=jnp.float64)
            for _, _, j in self._chunks():
                v, gj = self._fns["loss_grad"](wj, self.X[j], self.Y[j], self.mask[j])
                total += float(v)
                g += np.asarray(gj)
        return total / self.n, g / self.n

    def jacobian_chunks(self, w: np.ndarray):
        """Yield (lo, hi, f (hi - lo, k), J (hi - lo, k, D)) over the samples, in order."""
        _, jnp = _jax()
        with x64():
            wj = jnp.asarray(w, dtype=jnp.float64)
            for lo, hi, j in self._chunks():
                f, J = self._fns["jac"](wj, self.X[j])
                yield lo, hi, np.asarray(f)[: hi - lo], np.asarray(J)[: hi - lo]

    def jacobians(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """f (n, k) and J (n, k, D), refused in words when J cannot fit."""
        _check_memory(self.n * self.k * self.dim * 8,
                      f"the per-sample Jacobian of n = {self.n} samples x k = {self.k} outputs "
                      f"x D = {self.dim} parameters",
                      "use sharpness_nonuniformity(..., method='lanczos'), which runs over "
                      "chunks of samples, or a subset of the data (model.with_data)")
        F = np.empty((self.n, self.k))
        J = np.empty((self.n, self.k, self.dim))
        for lo, hi, f, Jc in self.jacobian_chunks(w):
            F[lo:hi], J[lo:hi] = f, Jc
        return F, J

    def input_jacobians(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        """d pred(w, x_i) / dx for the rows of X: (N, k, *x.shape), in chunks of ``chunk``."""
        _, jnp = _jax()
        N = X.shape[0]
        out = np.empty((N, self.k) + X.shape[1:])
        with x64():
            wj = jnp.asarray(w, dtype=jnp.float64)
            for lo in range(0, N, self.chunk):
                hi = min(lo + self.chunk, N)
                Xc = X[lo:hi]
                if hi - lo < self.chunk:  # pad: one program for every chunk
                    Xc = np.concatenate([Xc, np.repeat(Xc[:1], self.chunk - (hi - lo), 0)])
                out[lo:hi] = np.asarray(self._fns["input_jac"](wj, jnp.asarray(Xc)))[: hi - lo]
        return out

    def _mean(self, name: str, w: np.ndarray, V=None, k=None) -> tuple[np.ndarray, ...]:
        """(1/n) sum over the chunks j of the jitted ``name(w, [V,] X_j, mask_j[, k])``."""
        _, jnp = _jax()
        total = None
        with x64():
            args = [jnp.asarray(w, dtype=jnp.float64)]
            if V is not None:
                args.append(jnp.asarray(V, dtype=jnp.float64))
            for _, _, j in self._chunks():
                out = self._fns[name](*args, self.X[j], self.mask[j],
                                      *(() if k is None else (int(k),)))
                out = tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))
                total = out if total is None else tuple(t + o for t, o in zip(total, out))
        return tuple(t / self.n for t in total)

    def input_moment(self, w: np.ndarray, k: int) -> float:
        """(1/n) sum_i sum_entries (d pred(w, x_i) / dx)^(2k) over the training inputs."""
        return float(self._mean("input_moments", w, k=k)[0])

    def jacobian_moment(self, w: np.ndarray, k: int) -> float:
        """(1/n) sum_i sum_{c, d} J_i[c, d]^(2k): one pass."""
        return float(self._mean("moments", w, k=k)[0])

    def products(self, w: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean_i H_i V, mean_i H_i^2 V) for V (m, D), H_i = J_i^T J_i: one pass."""
        return self._mean("products", w, V)

    def gauss_newton(self, w: np.ndarray, V: np.ndarray) -> np.ndarray:
        """mean_i H_i V for V (m, D): one pass."""
        return self._mean("gauss_newton", w, V)[0]


# ---------------------------------------------------------------------------------- SGD
def run_sgd(pred: Callable, X: np.ndarray, Y: np.ndarray, W0: np.ndarray, lr: np.ndarray,
            wd: np.ndarray, batch: np.ndarray, batches: np.ndarray, steps: int,
            record_every: int, max_loss: float, chunk: int) -> dict[str, Any]:
    """Mini-batch SGD of T trajectories in XLA, the compiled engine's step and records.

    Step t of trajectory l: w <- (1 - lr_l wd_l) w - lr_l (1/B_l) sum_{i in I} grad l_i(w),
    l_i = ||pred(w, x_i) - y_i||^2 / 2, with I = ``batches[l, t, :B_l]``. A non-finite
    iterate flags divergence at t + 1 (the trajectory keeps its last finite iterate); a
    full-batch loss that is not finite or above ``max_loss`` at a recorded step flags it
    there; records from the divergence on are NaN, as engine/sgd.hpp writes them.

    Parameters
    ----------
    pred : callable
        ``pred(w, x) -> (k,)``.
    X, Y : ndarray, shapes (n, ...) and (n, k)
    W0 : ndarray, shape (T, D)
        Starts, float64 or float32 (the precision of the run).
    lr, wd : ndarray, shape (T,)
    batch : ndarray of int, shape (T,)
        B_l.
    batches : ndarray of int32, shape (T, steps, max B)
        Sample indices (entries beyond B_l unread).
    steps, record_every : int
    max_loss : float
    chunk : int
        Samples per chunk of the full-batch loss.

    Returns
    -------
    dict
        ``w`` (T, D), ``loss`` (records, T), ``diverged_step`` (T,) (-1: none).
    """
    jax, jnp = _jax()
    dtype = W0.dtype
    T, D = W0.shape
    n = X.shape[0]
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    Xp = np.concatenate([X, np.repeat(X[:1], pad, axis=0)]) if pad else X
    Yp = np.concatenate([Y, np.repeat(Y[:1], pad, axis=0)]) if pad else Y
    mask = np.concatenate([np.ones(n), np.zeros(pad)]).reshape(n_chunks, chunk)
    b_max = batches.shape[2]
    _check_memory(batches.nbytes * 2, f"the batches of {T} trajectories x {steps} steps",
                  "run fewer steps per call (continue from res.w with another seed)")
    with x64():
        Xd, Yd = jnp.asarray(X, dtype=dtype), jnp.asarray(Y, dtype=dtype)
        Xc = jnp.asarray(Xp.reshape((n_chunks, chunk) + X.shape[1:]), dtype=dtype)
        Yc = jnp.asarray(Yp.reshape(n_chunks, chunk, Y.shape[1]), dtype=dtype)
        Mc = jnp.asarray(mask, dtype=dtype)
        idx = jnp.asarray(batches, dtype=jnp.int32)
        lr_j, wd_j = jnp.asarray(lr, dtype=dtype), jnp.asarray(wd, dtype=dtype)
        b_j = jnp.asarray(batch, dtype=jnp.int32)
        slot = jnp.arange(b_max)
        over = jax.vmap(pred, in_axes=(None, 0))

        def full_loss(w):
            def one(carry, c):
                x, y, m = c
                r = over(w, x) - y
                return carry + 0.5 * jnp.sum(m[:, None] * r * r), None
            return jax.lax.scan(one, jnp.zeros((), dtype), (Xc, Yc, Mc))[0] / n

        def step_one(w, I, B, rate, decay):
            m = (slot < B).astype(dtype)

            def f(w):
                r = over(w, Xd[I]) - Yd[I]
                return 0.5 * jnp.sum(m[:, None] * r * r)
            return decay * w - rate * (jax.grad(f)(w) / B)

        steps_all = jax.vmap(step_one)

        @jax.jit
        def segment(W, alive, dstep, t0, t1):
            def body(t, state):
                W, alive, dstep = state
                Wn = steps_all(W, idx[:, t], b_j, lr_j, 1 - lr_j * wd_j)
                finite = jnp.all(jnp.isfinite(Wn), axis=1)
                dstep = jnp.where(alive & ~finite, t + 1, dstep)
                alive = alive & finite
                return jnp.where(alive[:, None], Wn, W), alive, dstep
            return jax.lax.fori_loop(t0, t1, body, (W, alive, dstep))

        record_all = jax.jit(jax.vmap(full_loss))
        n_rec = steps // record_every + 1
        loss = np.full((n_rec, T), np.nan)
        W = jnp.asarray(W0)
        alive = np.ones(T, bool)
        dstep = np.full(T, -1, dtype=np.int64)

        def record(r, t):
            L = np.asarray(record_all(W), dtype=np.float64)
            for lane in np.flatnonzero(alive):
                loss[r, lane] = L[lane]
                if not (np.isfinite(L[lane]) and L[lane] <= max_loss):
                    alive[lane], dstep[lane] = False, t

        record(0, 0)
        t = 0
        for r in range(1, n_rec + 1):
            t1 = min(r * record_every, steps)
            if t1 > t and alive.any():
                W, al, ds = segment(W, jnp.asarray(alive), jnp.asarray(dstep), t, t1)
                alive, dstep = np.array(al), np.array(ds, dtype=np.int64)
            t = t1
            if r < n_rec and alive.any():
                record(r, t)
        for lane in np.flatnonzero(dstep >= 0):
            s = int(dstep[lane])
            first = 1 if s == 0 else -(-s // record_every)
            loss[first:, lane] = np.nan
        return {"w": np.array(W), "loss": loss, "diverged_step": dstep}
