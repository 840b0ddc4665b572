"""The XLA backend (``backend="jax"``): kernels, Lanczos and the trajectory engine in JAX.

For one large network, XLA is the right engine: it runs the convolutions and matrix
products of a real network near the machine's limit, on the CPU and on any GPU JAX has. A
model reaches it as a pure JAX loss of the flat parameters, ``loss(w (D,), data) ->
scalar`` (``model._jax_loss()``), differentiated by JAX itself:

- the kernels: ``jax.value_and_grad``, the HVP as ``jvp`` of the gradient, D^3L[v, v] as
  ``jvp`` of the HVP, the Hessian as ``jacfwd(grad)``; rows of a batch by ``vmap``;
- Lanczos with full reorthogonalisation, the batch in lockstep (one HVP of the whole batch
  per iteration), locking for k > 1 as engine/lanczos.hpp does;
- the trajectory engine: the methods of ``_engine.methods.METHODS`` with the records of
  ``_engine.records.RECORDS``, as engine/trajectory.hpp computes them. The steps between
  two recorded steps run as one jitted ``fori_loop``; a recorded step is one jitted call
  (a Lanczos solve, warm-started from the last eigenvector, on sharpness steps).

Bits differ from the compiled core's (another order of summation, JAX's random
streams): the two agree to rounding before the Edge of Stability and statistically after
it. The loss is evaluated at w as it is: a model whose norm leaves the float range is
flagged as diverged, not rescaled as the compiled core does for exactly scale-invariant
losses (a real network's BN has an epsilon; rescaling would change its loss).
"""

from __future__ import annotations

import contextlib
import math
from functools import cached_property, partial
from typing import Any, Callable

import numpy as np

from .._engine import Method
from .._engine.memory import available_memory
from .._engine.methods import METHODS
from .._engine.records import run_outputs, run_result_names
from ._errors import BackendUnavailable


def probe() -> str | None:
    """None when JAX can run here, else why not."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return "jax is not installed (pip install jax)"
    return None


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:  # pragma: no cover - probe() said so first
        raise BackendUnavailable(f"the jax backend needs JAX: {exc}") from None
    return jax, jnp


@contextlib.contextmanager
def x64():
    """64-bit JAX inside the block only; the user's configuration is restored after it."""
    jax, _ = _jax()
    manager = getattr(jax, "enable_x64", None)
    if manager is None:
        try:
            from jax.experimental import enable_x64 as manager  # older JAX
        except ImportError:
            manager = None
    if manager is not None:
        with manager(True):
            yield
        return
    previous = bool(jax.config.read("jax_enable_x64"))
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def _seed_key(seed: int):
    """JAX's random key of a 64-bit seed (both halves folded in)."""
    jax, _ = _jax()
    return jax.random.fold_in(jax.random.key(seed % 2 ** 32), seed >> 32)


def _finite_rows(*arrays) -> Any:
    """(B,) bool: every entry of the row finite, over all ``arrays`` (B, ...)."""
    _, jnp = _jax()
    ok = jnp.ones(arrays[0].shape[0], dtype=bool)
    for a in arrays:
        ok = ok & jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1)
    return ok


class JaxCore:
    """A model's kernels and engine in XLA, with the compiled core's interface.

    Parameters
    ----------
    loss : callable
        ``loss(w, data) -> scalar``, w of shape (D,), pure JAX.
    data : pytree
        The arrays the loss reads (passed to every jitted call, not baked into it).
    dim : int
        D.
    dtype : float32 or float64
        The precision of every computation (float64 runs with JAX's x64 enabled).
    groups : ndarray of int, shape (D,), optional
        Group index of each coordinate, for models invariant to the scale of each of G > 1
        groups separately: the engine records each group's squared norm.
    """

    def __init__(self, loss: Callable, data: Any, dim: int, dtype, groups=None) -> None:
        probe_error = probe()
        if probe_error:
            raise BackendUnavailable(probe_error)
        self._loss = loss
        self._data = data
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self._groups = None if groups is None else np.asarray(groups, dtype=np.int32)
        self.n_groups = 1 if self._groups is None else int(self._groups.max()) + 1

    # -- the jitted functions, built once per core ----------------------------------------
    @cached_property
    def _fns(self) -> dict[str, Callable]:
        jax, jnp = _jax()
        f = self._loss
        grad = jax.grad(f)

        def hvp(w, v, d):
            return jax.jvp(lambda x: grad(x, d), (w,), (v,))[1]

        def third(w, v, d):
            return jax.jvp(lambda x: hvp(x, v, d), (w,), (v,))[1]

        rows = partial(jax.vmap, in_axes=(0, None))
        pairs = partial(jax.vmap, in_axes=(0, 0, None))
        return {
            "loss_grad": jax.jit(rows(jax.value_and_grad(f))),
            "hvp": jax.jit(pairs(hvp)),
            "third": jax.jit(pairs(third)),
            "hessian": jax.jit(rows(jax.jacfwd(grad))),
            "hvp_one": hvp,
            "value_and_grad": jax.value_and_grad(f),
        }

    def _call(self, name: str, *arrays):
        """Run the jitted kernel ``name`` on NumPy ``arrays``; NumPy results."""
        _, jnp = _jax()
        with x64():
            args = [jnp.asarray(a, dtype=self.dtype) for a in arrays]
            out = self._fns[name](*args, self._data)
            out = out if isinstance(out, tuple) else (out,)
            ok = _finite_rows(*[o.reshape(o.shape[0], -1) for o in out])
            # copies: the callers scale results in place, and JAX's buffers are read-only
            return tuple(np.array(o, dtype=self.dtype) for o in out) + \
                (np.array(ok, dtype=np.uint8),)

    def loss_grad(self, W):
        """(B, D) -> (loss (B,), grad (B, D), ok (B,))."""
        return self._call("loss_grad", W)

    def hvp(self, W, V):
        """(B, D), (B, D) -> (H v (B, D), ok (B,))."""
        return self._call("hvp", W, V)

    def third(self, W, V):
        """(B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))."""
        return self._call("third", W, V)

    def hessian(self, W):
        """(B, D) -> (H (B, D, D), ok (B,)): jacfwd of the gradient, D HVPs' worth."""
        _check_memory(W.shape[0] * self.dim * self.dim * self.dtype.itemsize * 3,
                      f"a dense Hessian of D = {self.dim}",
                      "use hvp with pysharp.hessian_spectrum or spherical_sharpness")
        return self._call("hessian", W)

    # -- Lanczos ----------------------------------------------------------------------------
    def lanczos(self, W, options: dict, start=None, streams=None, counter: int = 0):
        """As the compiled core's: ``options`` is ``LanczosOptions.to_core()``.

        Returns (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,),
        converged (B,), ok (B,)); the random starts from JAX's generator keyed by
        (seed, streams[b] (default b), counter).
        """
        _, jnp = _jax()
        W = np.ascontiguousarray(W, dtype=self.dtype)
        B = W.shape[0]
        streams = np.arange(B, dtype=np.uint64) if streams is None else np.asarray(streams)
        with x64():
            out = self._lanczos(jnp.asarray(W), options, None if start is None
                                else jnp.asarray(start, dtype=self.dtype),
                                streams, int(counter))
        return tuple(np.array(a) for a in out)  # writable copies

    def _keys(self, seed: int, streams, counter: int, salt: int):
        jax, jnp = _jax()
        base = jax.random.fold_in(jax.random.fold_in(_seed_key(seed), counter), salt)
        return jax.vmap(lambda s: jax.random.fold_in(base, s))(
            jnp.asarray(np.asarray(streams, dtype=np.uint64) % 2 ** 32, dtype=jnp.uint32))

    def _lanczos(self, W, o: dict, start, streams, counter: int):
        """The locked solve of engine/lanczos.hpp on a batch (JAX arrays in and out)."""
        jax, jnp = _jax()
        k, m_max, tol = int(o["k"]), int(o["max_iter"]), float(o["tol"])
        sign = -1.0 if o["smallest"] else 1.0
        D, B = self.dim, W.shape[0]
        _check_memory(B * (m_max + 1) * D * self.dtype.itemsize,
                      f"a Krylov basis of {m_max} vectors of D = {D} for {B} points",
                      "lower lanczos_max_iter, or fewer points per call")
        run = self._lanczos_run(k, m_max, int(o["min_iter"]), tol, sign, 0)
        keys = self._keys(int(o["seed"]), streams, counter, 0)
        have = jnp.zeros(B, bool) if start is None else jnp.ones(B, bool)
        start = jnp.zeros((B, D), self.dtype) if start is None else start
        evals, evecs, resid, iters, conv, ok, scale = run(W, start, have, keys,
                                                          jnp.zeros((B, 0, D), self.dtype),
                                                          self._data)
        m_c = min(m_max, D - k)
        if k > 1 and m_c >= 1:
            eps = float(np.finfo(self.dtype).eps)
            rel = max(tol, 100 * eps)
            settled = jnp.zeros(B, bool)
            check_conv = jnp.zeros(B, bool)
            complement = self._lanczos_run(1, m_c, int(o["min_iter"]), tol, sign, k)
            for r in range(1, k + 2):
                ck = self._keys(int(o["seed"]), streams, counter, 2048 * r)
                cval, cvec, cres, citers, cconv, cok, cscale = complement(
                    W, jnp.zeros((B, D), self.dtype), jnp.zeros(B, bool), ck, evecs,
                    self._data)
                iters = iters + jnp.where(settled, 0, citers)
                ok = ok & (settled | cok)
                scale = jnp.where(settled, scale, jnp.maximum(scale, cscale))
                above = cval[:, 0] > evals[:, k - 1] + rel * scale
                newly = ~settled & ~above
                check_conv = jnp.where(newly, cconv, check_conv)
                merge = ~settled & above & cok
                settled = settled | newly | ~cok
                # insert the complement's pair in descending order, dropping the k-th
                vals = jnp.concatenate([evals, cval], axis=1)
                order = jnp.argsort(-vals, axis=1, stable=True)[:, :k]
                take = partial(jnp.take_along_axis, axis=1)
                evals = jnp.where(merge[:, None], take(vals, order), evals)
                resid = jnp.where(merge[:, None],
                                  take(jnp.concatenate([resid, cres], axis=1), order), resid)
                vecs = jnp.concatenate([evecs, cvec], axis=1)
                evecs = jnp.where(merge[:, None, None], take(vecs, order[:, :, None]), evecs)
                if bool(jnp.all(settled)):
                    break
            conv = settled & check_conv & jnp.all(resid <= tol * scale[:, None], axis=1)
        elif k > 1:
            conv = jnp.all(resid <= tol * scale[:, None], axis=1)
        return sign * evals, evecs, resid, iters, conv, ok

    def _lanczos_run(self, k: int, m_max: int, min_iter: int, tol: float, sign: float,
                     n_locked: int) -> Callable:
        """One jitted Lanczos run (engine/lanczos.hpp's lanczos_run), cached by its shape."""
        key = ("lanczos", k, m_max, min_iter, tol, sign, n_locked)
        cache = self.__dict__.setdefault("_runs", {})
        if key not in cache:
            cache[key] = _build_lanczos_run(self._fns["hvp_one"], self.dim, self.dtype, k,
                                            m_max, min_iter, tol, sign)
        return cache[key]

    # -- the engine --------------------------------------------------------------------------
    def run(self, W0, hyper: dict, config: dict, offset: int = 0) -> dict:
        """As the compiled core's: ``hyper`` {name: (B,)}, ``config`` ``EngineConfig.to_core()``,
        ``offset`` the first trajectory's global index (keys its random streams)."""
        with x64():
            return _Engine(self, W0, hyper, config, offset).run()


def _check_memory(nbytes: int, what: str, remedy: str) -> None:
    """MemoryError in words, before JAX would fail to allocate, for an array beyond half of
    the memory this process may use."""
    room = available_memory()
    limit = room // 2 if room is not None else None
    if limit is not None and nbytes > limit:
        raise MemoryError(f"{what} needs {nbytes / 2 ** 30:.1f} GiB, more than half of the "
                          f"{limit * 2 / 2 ** 30:.1f} GiB available here; {remedy}")


#: Rows of the Krylov basis projected out per step of the reorthogonalisation loop.
_BLOCK = 16


def _build_lanczos_run(hvp: Callable, D: int, dtype, k: int, m_max: int, min_iter: int,
                       tol: float, sign: float) -> Callable:
    """``run(W, start, have_start, keys, locked (B, L, D), data)`` -> (evals (B, k) of
    sign * H descending, evecs (B, k, D), true residuals (B, k), iterations (B,),
    converged (B,), ok (B,), spread (B,) the largest |Ritz value|): Lanczos with full
    reorthogonalisation on the batch in lockstep, each point stopping on its own test."""
    jax, jnp = _jax()
    real = jnp.dtype(dtype)
    small_rel = 1e-12 if real == jnp.float64 else 1e-5

    def apply(W, X, data):
        return sign * jax.vmap(hvp, in_axes=(0, 0, None))(W, X, data)

    rows = _BLOCK * -(-(m_max + 1) // _BLOCK)  # Q's rows, whole blocks (zero beyond use)

    def project(z, basis):  # z (B, D) minus its components on the rows of basis (B, n, D)
        return z - jnp.einsum("bn,bnd->bd", jnp.einsum("bnd,bd->bn", basis, z), basis)

    def project_q(z, Q, n):
        """z minus its components on Q's first n rows, a block of rows at a time: the cost
        grows with the Krylov dimension reached, not with the cap (rows past n are 0)."""
        def block(b, z):
            return project(z, jax.lax.dynamic_slice_in_dim(Q, b * _BLOCK, _BLOCK, axis=1))
        return jax.lax.fori_loop(0, (n + _BLOCK - 1) // _BLOCK, block, z)

    def orthogonalised(z, Q, n, locked):  # twice is enough
        for _ in range(2):
            z = project_q(project(z, locked), Q, n)
        return z

    def random_unit(keys, j, Q, n, locked):
        z = jax.vmap(lambda kk: jax.random.normal(jax.random.fold_in(kk, j), (D,), real))(keys)
        z = orthogonalised(z, Q, n, locked)
        nrm = jnp.linalg.norm(z, axis=1, keepdims=True)
        return z / jnp.where(nrm > 0, nrm, 1), nrm[:, 0] > 1e-3

    def ritz(alpha, beta, m):
        """Eigen-decomposition of each T_m padded to m_max (padding below the spectrum)."""
        idx = jnp.arange(m_max)
        inside = idx[None, :] < m[:, None]
        off = jnp.where(idx[None, :-1] + 1 < m[:, None], beta[:, :-1], 0)
        bound = jnp.max(jnp.where(inside, jnp.abs(alpha), 0), axis=1) + \
            2 * jnp.max(jnp.abs(off), axis=1, initial=0) + 1
        diag = jnp.where(inside, alpha, -bound[:, None])
        T = jax.vmap(jnp.diag)(diag) + jax.vmap(lambda o: jnp.diag(o, 1) + jnp.diag(o, -1))(off)
        vals, vecs = jnp.linalg.eigh(T)
        return vals[:, ::-1], vecs[:, :, ::-1], inside  # descending

    def converged_now(alpha, beta, m, j):
        vals, vecs, inside = ritz(alpha, beta, m)
        top = jnp.max(jnp.where(inside, jnp.abs(vals), 0), axis=1)
        floor = jnp.where(top > 0, top, 1)
        last = jnp.take_along_axis(vecs, (m - 1)[:, None, None], axis=1)[:, 0, :k]
        return jnp.all(beta[:, j][:, None] * jnp.abs(last) <= tol * floor[:, None], axis=1)

    def run(W, start, have_start, keys, locked, data):
        B = W.shape[0]
        Q = jnp.zeros((B, rows, D), real)
        q0, good0 = random_unit(keys, 0, Q, 0, locked)
        n0 = jnp.linalg.norm(start, axis=1, keepdims=True)
        use = have_start & (n0[:, 0] > 0)
        q0 = jnp.where(use[:, None], start / jnp.where(n0 > 0, n0, 1), q0)
        ok0 = use | good0
        Q = Q.at[:, 0].set(q0)
        state = (0, Q, jnp.zeros((B, m_max), real), jnp.zeros((B, m_max), real),
                 jnp.zeros(B, jnp.int32), ~ok0, jnp.zeros(B, bool), ok0)

        def cond(s):
            j, _, _, _, _, done, _, _ = s
            return (j < m_max) & ~jnp.all(done)

        def body(s):
            j, Q, alpha, beta, m, done, conv, ok = s
            q = Q[:, j]
            z = apply(W, q, data)
            ok = ok & (done | jnp.all(jnp.isfinite(z), axis=1))
            a = jnp.sum(q * z, axis=1)
            prev = jnp.where(j > 0, beta[:, j - 1], 0)
            z = z - a[:, None] * q - prev[:, None] * Q[:, j - 1]
            z = orthogonalised(z, Q, j + 1, locked)
            b = jnp.linalg.norm(z, axis=1)
            live = ~done & ok
            alpha = jnp.where(live[:, None], alpha.at[:, j].set(a), alpha)
            beta = jnp.where(live[:, None], beta.at[:, j].set(b), beta)
            m = jnp.where(live, j + 1, m)
            test = (j + 1 >= k) & ((j + 1 == m_max) |
                                   ((j + 1 >= min_iter) & ((j + 1 - min_iter) % 2 == 0)))
            now = jax.lax.cond(test, lambda: converged_now(alpha, beta, m, j),
                               lambda: jnp.zeros(B, bool))
            conv = jnp.where(live & test, now, conv)
            stop = live & (now | (j + 1 == m_max))
            # an invariant subspace: go on from a fresh direction, or stop when none is left
            tiny = b <= small_rel * jnp.where(jnp.abs(a) + prev > 0, jnp.abs(a) + prev, 1)
            fresh, found = jax.lax.cond(  # rare: drawn only when some point needs it
                jnp.any(live & tiny), lambda: random_unit(keys, j + 1, Q, j + 1, locked),
                lambda: (z, jnp.ones(B, bool)))
            exhausted = live & ~stop & tiny & ((j + 1 + locked.shape[1] >= D) | ~found)
            conv = conv | exhausted
            beta = jnp.where((live & tiny)[:, None], beta.at[:, j].set(0), beta)
            nxt = jnp.where(tiny[:, None], fresh, z / jnp.where(b > 0, b, 1)[:, None])
            Q = jnp.where(live[:, None, None], Q.at[:, j + 1].set(nxt), Q)
            done = done | stop | exhausted | ~ok
            return j + 1, Q, alpha, beta, m, done, conv, ok

        _, Q, alpha, beta, m, _, conv, ok = jax.lax.while_loop(cond, body, state)
        vals, vecs, inside = ritz(alpha, beta, m)
        spread = jnp.max(jnp.where(inside, jnp.abs(vals), 0), axis=1)
        S = jnp.where(inside[:, :, None], vecs[:, :, :k], 0)       # (B, m_max, k)
        V = jnp.einsum("bmd,bmk->bkd", Q[:, :m_max], S)
        V = V / jnp.linalg.norm(V, axis=2, keepdims=True)
        big = jnp.take_along_axis(V, jnp.argmax(jnp.abs(V), axis=2)[:, :, None], axis=2)
        V = jnp.where(big < 0, -V, V)
        evals = jnp.where(jnp.arange(k)[None, :] < m[:, None], vals[:, :k], jnp.nan)
        AV = jax.vmap(lambda v: apply(W, v, data), in_axes=1, out_axes=1)(V)
        resid = jnp.linalg.norm(AV - evals[:, :, None] * V, axis=2)
        ok = ok & jnp.all(jnp.isfinite(AV.reshape(B, -1)), axis=1)
        return evals, V, resid, m, conv, ok, spread

    return jax.jit(run)


def _engine_functions(core: JaxCore, method: Method, jitter: bool) -> dict[str, Callable]:
    """The engine's jitted step program for ``method`` on ``core``: ``segment(state, consts,
    data, t0, n)``, n steps with nothing recorded, then step t0 + n measured and taken. The
    scalar options travel in ``consts``, so a new learning rate, seed or RMSprop beta
    reuses the compiled program."""
    jax, jnp = _jax()
    spec = METHODS[method.name.lower()]
    vg = jax.vmap(core._fns["value_and_grad"], in_axes=(0, None))
    D, real, groups, G = core.dim, jnp.dtype(core.dtype), core._groups, core.n_groups

    def evaluate(state, consts, data, t):
        w = state["w"]
        loss, g = vg(w, data)
        norm2 = jnp.sum(w * w, axis=1)
        gnorm2 = jnp.sum(g * g, axis=1)
        defined = jnp.isfinite(loss) & jnp.isfinite(gnorm2) & jnp.isfinite(norm2)
        flag = state["alive"] & ~defined
        state = dict(state, alive=state["alive"] & defined,
                     div_step=jnp.where(flag, t, state["div_step"]))
        if method == Method.SCALAR_RMSPROP:
            beta = consts["rms_beta"]
            state["rms_v"] = beta * state["rms_v"] + (1 - beta) * gnorm2
        return state, (loss, g, norm2, gnorm2)

    def step(state, consts, ev, t):
        """engine/trajectory.hpp's TrajectoryRunner::step."""
        _, g, norm2, gnorm2 = ev
        w, eta, live = state["w"], state["eta"], state["alive"]
        norm = jnp.sqrt(norm2)
        if spec.on_sphere:
            nxt = w / norm[:, None] - (eta * norm)[:, None] * g
        else:
            size = consts["rate"] / (jnp.sqrt(state["rms_v"]) + consts["rms_eps"]) \
                if method == Method.SCALAR_RMSPROP else consts["rate"]
            nxt = consts["decay"][:, None] * w - size[:, None] * g
        if jitter:  # sigma ||w|| xi, xi ~ N(0, I/D), keyed by (seed, trajectory, step)
            keys = jax.vmap(lambda tr: jax.random.fold_in(
                jax.random.fold_in(consts["key"], tr), t))(consts["traj"])
            xi = jax.vmap(lambda kk: jax.random.normal(kk, (D,), real))(keys)
            nxt = nxt + (consts["jitter"] * norm / math.sqrt(D))[:, None] * xi
        if spec.on_sphere:
            nxt = nxt / jnp.linalg.norm(nxt, axis=1, keepdims=True)
        finite = jnp.all(jnp.isfinite(nxt), axis=1)
        w = jnp.where((finite & live)[:, None], nxt, w)
        decay = consts["decay"]
        if method == Method.PGD_ADAPTIVE:
            eta = 1 / (decay * decay * (1 / eta + eta * norm2 * gnorm2))
        elif method == Method.PGD_QUASI_RMSPROP:
            cg2 = consts["c"] * norm2 * gnorm2
            eta = 1 / jnp.sqrt(consts["rms_beta"] / (eta * eta) + cg2 +
                               consts["qr_kappa"] * cg2 * cg2 * eta * eta)
        return dict(state, w=w, eta=eta, alive=live & finite,
                    div_step=jnp.where(live & ~finite, t + 1, state["div_step"]))

    def segment(state, consts, data, t0, n):
        """Steps t0 .. t0 + n - 1 with nothing recorded, then the measured step t = t0 + n:
        (the state at t before its update, after it, the records of t). One program for
        both, so a network's forward and backward pass is compiled once."""
        def body(i, s):
            s, ev = evaluate(s, consts, data, t0 + i)
            return step(s, consts, ev, t0 + i)
        state = jax.lax.fori_loop(0, n, body, state)
        t = t0 + n
        state, ev = evaluate(state, consts, data, t)
        loss, g, norm2, gnorm2 = ev
        if spec.on_sphere:  # the effective LR of this step on the sphere
            eff = state["eta"]
        elif method == Method.SCALAR_RMSPROP:
            eff = consts["rate"] / ((jnp.sqrt(state["rms_v"]) + consts["rms_eps"]) *
                                    consts["decay"] * norm2)
        else:
            eff = consts["rate"] / (consts["decay"] * norm2)
        norm = jnp.sqrt(norm2)
        rec = {"loss": loss, "norm2": norm2, "eff_lr": eff, "grad_norm": norm * jnp.sqrt(gnorm2),
               "theta": state["w"] / norm[:, None], "g": g}
        if groups is not None and G > 1:
            ids = jnp.asarray(groups)
            rec["group_norm2"] = jax.vmap(
                lambda w: jax.ops.segment_sum(w * w, ids, num_segments=G))(state["w"])
        return state, step(state, consts, ev, t), rec

    return {"segment": jax.jit(segment)}


class _Engine:
    """One batch of trajectories (engine/trajectory.hpp's TrajectoryRunner, in JAX)."""

    def __init__(self, core: JaxCore, W0, hyper: dict, config: dict, offset: int) -> None:
        jax, jnp = _jax()
        self.core, self.c, self.lz = core, config, config["lanczos"]
        self.spec = METHODS[Method(config["method"]).name.lower()]
        self.offset = int(offset)
        real = core.dtype
        W0 = np.ascontiguousarray(W0, dtype=real)
        self.B, self.D = W0.shape
        B = self.B
        zero = np.zeros(B, real)
        h = {name: np.asarray(v, dtype=real) for name, v in hyper.items()}
        rate = h["eta"] if self.spec.on_sphere else h["lr"]
        decay = 1 - h["lr"] * h["wd"] if "wd" in h else np.ones(B, real)
        seed = int(config["seed"])
        self.consts = {"rate": jnp.asarray(rate), "decay": jnp.asarray(decay),
                       "c": jnp.asarray(h.get("c", zero)),
                       "traj": jnp.asarray(np.arange(B, dtype=np.uint32) + offset),
                       "key": _seed_key(seed),
                       **{name: jnp.asarray(float(config[name]), real) for name in
                          ("rms_beta", "rms_eps", "qr_kappa", "jitter")}}
        self.state = {"w": jnp.asarray(W0), "eta": jnp.asarray(rate),
                      "rms_v": jnp.zeros(B, real), "alive": jnp.ones(B, bool),
                      "div_step": jnp.full(B, -1, jnp.int64),
                      "v1": jnp.zeros((B, self.D), real), "have_v1": jnp.zeros(B, bool)}
        steps = int(config["steps"])
        shapes = run_outputs(B, self.D, core.n_groups, steps=steps,
                             record_every=int(config["record_every"]),
                             sharpness_every=int(config["sharpness_every"]),
                             theta_every=int(config["theta_every"]),
                             top_k=int(config["top_k"]), real=real)
        self.out = {name: np.full(shape, np.nan, dtype) if dtype.kind == "f"
                    else np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}
        self.rows = {"record": 0, "sharpness": 0, "theta": 0}

    def _sharpness(self, state, t: int, rec: dict) -> dict:
        """The sharpness solve at step t for the live trajectories: records and v1."""
        jax, jnp = _jax()
        core, lz = self.core, self.lz
        run = core._lanczos_run(1, int(lz["max_iter"]), int(lz["min_iter"]), float(lz["tol"]),
                                1.0, 0)
        streams = np.arange(self.B, dtype=np.uint64) + self.offset
        keys = core._keys(int(lz["seed"]), streams, t, 0)
        evals, evecs, _, _, conv, ok, _ = run(state["w"], state["v1"], state["have_v1"], keys,
                                              jnp.zeros((self.B, 0, self.D), core.dtype),
                                              core._data)
        ev, vec = evals[:, 0], evecs[:, 0]
        good = ok & jnp.isfinite(ev)
        flag = state["alive"] & ~good
        flip = jnp.where(state["have_v1"] & (jnp.sum(vec * state["v1"], axis=1) < 0), -1, 1)
        upd = state["alive"] & good
        state = dict(state, alive=state["alive"] & good,
                     div_step=jnp.where(flag, t, state["div_step"]),
                     v1=jnp.where(upd[:, None], flip[:, None] * vec, state["v1"]),
                     have_v1=state["have_v1"] | upd)
        sharp = ev * rec["norm2"]
        return state, {"sharpness": sharp, "eos_ratio": rec["eff_lr"] * sharp,
                       "sharpness_converged": conv, "alive": upd}

    def _top_k(self, state, t: int, norm2) -> Any:
        _, jnp = _jax()
        lz = dict(self.lz, k=int(self.c["top_k"]))
        streams = np.arange(self.B, dtype=np.uint64) + self.offset
        evals, _, _, _, _, ok = self.core._lanczos(state["w"], lz, None, streams, t)
        return jnp.where(ok[:, None], evals * norm2[:, None], jnp.nan)

    def run(self) -> dict:
        _, jnp = _jax()
        c, out = self.c, self.out
        steps = int(c["steps"])
        every = {"record": int(c["record_every"]), "sharpness": int(c["sharpness_every"]),
                 "theta": int(c["theta_every"])}
        events = sorted({t for kind, e in every.items() if e > 0
                         for t in range(0, steps + 1, e)} | {steps})
        method = Method(c["method"])
        key = ("engine", method, float(c["jitter"]) > 0)
        cache = self.core.__dict__.setdefault("_runs", {})
        if key not in cache:
            cache[key] = _engine_functions(self.core, method, float(c["jitter"]) > 0)
        fns, data = cache[key], self.core._data
        state, t = self.state, 0
        for te in events:
            # the state is at step t: plain steps up to the event, then the event's
            before, state, rec = fns["segment"](state, self.consts, data, t, te - t)
            t = te
            is_event = {kind: e > 0 and t % e == 0 for kind, e in every.items()}
            if t == steps:  # the last step is measured, not taken
                state = before
            alive = np.asarray(before["alive"])
            if is_event["sharpness"]:
                solved, sh = self._sharpness(before, t, rec)
                alive = np.asarray(sh["alive"])
                # a trajectory the solve flags keeps its iterate of step t, unstepped
                lost = before["alive"] & ~solved["alive"]
                state = dict(state, v1=solved["v1"], have_v1=solved["have_v1"],
                             w=jnp.where(lost[:, None], before["w"], state["w"]),
                             alive=state["alive"] & solved["alive"],
                             div_step=jnp.where(before["alive"] & ~solved["alive"], t,
                                                state["div_step"]))
                r = self.rows["sharpness"]
                for name in ("sharpness", "eos_ratio"):
                    out[name][r] = np.where(alive, np.asarray(sh[name]), np.nan)
                out["sharpness_converged"][r] = np.asarray(sh["sharpness_converged"]) & alive
                if "top_eigenvalues" in out and out["top_eigenvalues"].shape[0]:
                    top = np.asarray(self._top_k(before, t, rec["norm2"]))
                    out["top_eigenvalues"][r] = np.where(alive[:, None], top, np.nan)
                self.rows["sharpness"] += 1
                before = solved
            if is_event["record"]:
                r = self.rows["record"]
                for name in ("loss", "norm2", "eff_lr", "grad_norm"):
                    out[name][r] = np.where(alive, np.asarray(rec[name]), np.nan)
                if out["top_grad"].shape[0]:
                    tg = jnp.sqrt(rec["norm2"]) * jnp.sum(rec["g"] * before["v1"], axis=1)
                    tg = np.where(np.asarray(before["have_v1"]), np.asarray(tg), np.nan)
                    out["top_grad"][r] = np.where(alive, tg, np.nan)
                if "group_norm2" in rec:
                    out["group_norm2"][r] = np.where(alive[:, None],
                                                     np.asarray(rec["group_norm2"]), np.nan)
                self.rows["record"] += 1
            if is_event["theta"]:
                r = self.rows["theta"]
                out["theta"][r] = np.where(alive[:, None], np.asarray(rec["theta"]), np.nan)
                self.rows["theta"] += 1
            t = te + 1  # observe stepped
            if not bool(jnp.any(state["alive"])):
                break
        out["w"][:] = np.asarray(state["w"])
        out["diverged"][:] = ~np.asarray(state["alive"])
        out["diverged_step"][:] = np.asarray(state["div_step"])
        groups, top_k = self.core.n_groups, int(c["top_k"])
        return {name: out[name] for name in run_result_names(groups, top_k)}


__all__ = ["JaxCore", "probe", "x64"]
