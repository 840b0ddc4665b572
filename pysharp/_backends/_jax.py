"""The XLA backend (``backend="jax"``): kernels, Lanczos and the trajectory engine in JAX.

For one large network, XLA is the right engine: it runs the convolutions and matrix
products of a real network near the machine's limit, on the CPU and on any GPU JAX has. A
model reaches it as a pure JAX loss of the flat parameters, ``loss(w (D,), data) ->
scalar`` (``model._jax_loss()``), differentiated by JAX itself:

- the kernels: ``jax.value_and_grad``, the HVP as ``jvp`` of the gradient, D^3L[v, v] as
  ``jvp`` of the HVP, the Hessian as ``jacfwd(grad)``; rows of a batch by ``vmap``;
- Lanczos with full reorthogonalisation, the batch in lockstep, each solve one compiled
  program with no return to Python per iteration: the HVPs of a solve are one linear map
  from ``jax.linearize`` of the gradient (the forward and backward pass at w once per
  solve), the test is the Ritz residual bound at every step from ``min_iter`` on, and
  k <= 4 pairs come from one block Lanczos run of block size k, which sees each eigenvalue
  with its multiplicity up to k without locking; larger k locks and checks the orthogonal
  complement as engine/lanczos.hpp does; ``multiplicity=False`` takes the top k Ritz pairs
  of one single-vector run instead (fewer HVPs; a repeated eigenvalue is seen once). k = 1
  is always one single-vector run. ``iterations`` counts HVPs (k per block step);
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
from collections.abc import Callable
from functools import cached_property, partial
from typing import Any

import numpy as np

from .._engine import Method
from .._engine.memory import available_memory
from .._engine.methods import METHODS
from .._engine.records import BY_NAME, RECORDS, run_outputs, run_result_names
from ._errors import BackendUnavailable

#: The records a record step and a sharpness step copy as they are from the step's values
#: (``rec`` and ``sh`` below), read from the table: the real scalars written always. A new
#: such row of records.py needs only its value computed there.
_PLAIN = {every: tuple(r.name for r in RECORDS
                       if r.every == every and not r.item and not r.when and r.dtype == "real")
          for every in ("record", "sharpness")}


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
            "grad": grad,
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
    def lanczos(self, W, options: dict, start=None, streams=None, counter: int = 0, *,
                multiplicity: bool = True):
        """As the compiled core's: ``options`` is ``LanczosOptions.to_core()``.

        Parameters
        ----------
        W : ndarray, shape (B, D)
            The points.
        options : dict
            ``LanczosOptions.to_core()``: k, max_iter, min_iter, tol, seed, smallest.
        start : ndarray, shape (B, D), optional
            Warm starts (e.g. the last top eigenvectors).
        streams : ndarray of uint64, shape (B,), optional
            Keys of the rows' random starts (default 0 .. B - 1).
        counter : int
            Keys the random starts with ``seed`` and ``streams``.
        multiplicity : bool
            True (the default): a repeated eigenvalue fills as many of the k slots as its
            multiplicity, from a block of k starts (k <= 4) or by locking and checking the
            orthogonal complement (k > 4). False: the top k Ritz pairs of one single-vector
            Krylov sequence, with no complement check, which takes fewer HVPs for k > 1
            (on bench/xla.py's small CNN, a top-2 solve to 1e-6 took 22 products against
            the block's 32). For k = 1 both are the same single-vector Lanczos run. Do not
            use False for k > 1 where an eigenvalue among the top k may be repeated: one
            Krylov sequence holds one vector of each eigenspace (rounding may reveal a
            second in a long run, but nothing guarantees it), so the slots a repeated
            eigenvalue should fill may get the next eigenvalues down, reported as
            converged (tests/test_xla_lanczos.py shows it happen).

        Returns
        -------
        tuple
            (evals (B, k), evecs (B, k, D), resid (B, k), iterations (B,), converged (B,),
            ok (B,)); the random starts from JAX's generator keyed by (seed, streams[b],
            counter). ``iterations`` counts HVPs per point.
        """
        _, jnp = _jax()
        W = np.ascontiguousarray(W, dtype=self.dtype)
        B = W.shape[0]
        streams = np.arange(B, dtype=np.uint64) if streams is None else np.asarray(streams)
        with x64():
            out = self._lanczos(jnp.asarray(W), options, None if start is None
                                else jnp.asarray(start, dtype=self.dtype),
                                streams, int(counter), multiplicity=multiplicity)
        return tuple(np.array(a) for a in out)  # writable copies

    def _lanczos(self, W, o: dict, start, streams, counter: int, *, multiplicity: bool = True):
        """A solve on a batch (JAX arrays in and out): with ``multiplicity``, for k <=
        ``_MAX_BLOCK`` one block Lanczos run of block size k, one compiled program, above it
        engine/lanczos.hpp's single-vector run with locking and complement checks; without,
        the single-vector run alone."""
        _, jnp = _jax()
        k, m_max, tol = int(o["k"]), int(o["max_iter"]), float(o["tol"])
        sign = -1.0 if o["smallest"] else 1.0
        D, B = self.dim, W.shape[0]
        _check_memory(B * (m_max + 2 * k) * D * self.dtype.itemsize,
                      f"a Krylov basis of {m_max} vectors of D = {D} for {B} points",
                      "lower lanczos_max_iter, or fewer points per call")
        block = k if k <= _MAX_BLOCK and multiplicity else 1
        run = self._lanczos_run(k, block, m_max, int(o["min_iter"]), tol, sign, 0, True)
        seed = _seed_words(int(o["seed"]))
        words = jnp.asarray(np.asarray(streams, dtype=np.uint64) % 2 ** 32, dtype=jnp.uint32)
        have = jnp.zeros(B, bool) if start is None else jnp.ones(B, bool)
        start = jnp.zeros((B, D), self.dtype) if start is None else start
        evals, evecs, resid, iters, conv, ok, scale = run(
            W, start, have, seed, words, counter, 0, jnp.zeros((B, 0, D), self.dtype),
            self._data)
        m_c = min(m_max, D - k)
        if multiplicity and block == 1 and k > 1 and m_c >= 1:
            eps = float(np.finfo(self.dtype).eps)
            rel = max(tol, 100 * eps)
            settled = jnp.zeros(B, bool)
            check_conv = jnp.zeros(B, bool)
            complement = self._lanczos_run(1, 1, m_c, int(o["min_iter"]), tol, sign, k, True)
            for r in range(1, k + 2):
                cval, cvec, cres, citers, cconv, cok, cscale = complement(
                    W, jnp.zeros((B, D), self.dtype), jnp.zeros(B, bool), seed, words,
                    counter, 2048 * r, evecs, self._data)
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

    def _lanczos_run(self, k: int, block: int, m_max: int, min_iter: int, tol: float,
                     sign: float, n_locked: int, true_resid: bool) -> Callable:
        """One jitted Lanczos run (:func:`_build_lanczos_run`), cached by its shape."""
        key = ("lanczos", k, block, m_max, min_iter, tol, sign, n_locked, true_resid)
        cache = self.__dict__.setdefault("_runs", {})
        if key not in cache:
            cache[key] = _build_lanczos_run(self._fns["grad"], self.dim, self.dtype,
                                            k, block, m_max, min_iter, tol, sign, true_resid)
        return cache[key]

    # -- the engine --------------------------------------------------------------------------
    @cached_property
    def rows_apart(self) -> bool:
        """Whether a batch of trajectories runs one row at a time instead of vmapped: on
        XLA's CPU, for a loss with convolutions. Vmapped over rows whose kernels differ, a
        convolution becomes a grouped convolution, which XLA's CPU runs far slower than the
        rows' convolutions one after another (bench/xla.py: 16 learning rates of a small
        CNN, 0.3-0.6x the throughput of 16 runs); matrix products batch well and stay
        vmapped, as everything does on a GPU."""
        jax, jnp = _jax()
        if jax.default_backend() != "cpu":
            return False
        with x64():
            program = jax.make_jaxpr(self._fns["value_and_grad"])(
                jnp.zeros(self.dim, self.dtype), self._data)
        return "conv_general_dilated" in str(program)

    def run(self, W0, hyper: dict, config: dict, offset: int = 0) -> dict:
        """As the compiled core's: ``hyper`` {name: (B,)}, ``config`` ``EngineConfig.to_core()``,
        ``offset`` the first trajectory's global index (keys its random streams). A batch
        runs vmapped, or one row at a time where :attr:`rows_apart` says that is faster
        (every row keyed by its global index either way)."""
        W0 = np.asarray(W0)
        with x64():
            if W0.shape[0] == 1 or not self.rows_apart:
                return _Engine(self, W0, hyper, config, offset).run()
            parts = [_Engine(self, W0[i:i + 1], {name: np.asarray(v)[i:i + 1]
                                                  for name, v in hyper.items()},
                             config, offset + i).run() for i in range(W0.shape[0])]
        return {name: np.concatenate([p[name] for p in parts],
                                     axis=1 if BY_NAME[name].every else 0)
                for name in parts[0]}


def _check_memory(nbytes: int, what: str, remedy: str) -> None:
    """MemoryError in words, before JAX would fail to allocate, for an array beyond half of
    the memory this process may use."""
    room = available_memory()
    limit = room // 2 if room is not None else None
    if limit is not None and nbytes > limit:
        raise MemoryError(f"{what} needs {nbytes / 2 ** 30:.1f} GiB, more than half of the "
                          f"{limit * 2 / 2 ** 30:.1f} GiB available here; {remedy}")


#: The largest k solved by one block Lanczos run of block size k, without locking: a block of
#: k random starts sees every eigenvalue of multiplicity up to k with its multiplicity. Above
#: it, single-vector runs with locking (engine/lanczos.hpp's scheme).
_MAX_BLOCK = 4


def _seed_words(seed: int):
    """A 64-bit seed as the two uint32 words :func:`_key_of` folds."""
    _, jnp = _jax()
    return jnp.asarray([seed % 2 ** 32, seed >> 32], dtype=jnp.uint32)


def _key_of(words):
    """:func:`_seed_key` of a seed given as its two words (traceable)."""
    jax, _ = _jax()
    return jax.random.fold_in(jax.random.key(words[0]), words[1])


def _build_lanczos_run(grad: Callable, D: int, dtype, k: int, b: int, m_max: int,
                       min_iter: int, tol: float, sign: float, true_resid: bool) -> Callable:
    """One jitted block Lanczos run with full reorthogonalisation on a batch in lockstep.

    ``run(W (B, D), start (B, D), have_start (B,), seed (2,) uint32, streams (B,) uint32,
    counter, salt, locked (B, L, D), data)`` -> (evals (B, k) of sign * H, descending;
    evecs (B, k, D); residuals (B, k); iterations (B,) HVPs; converged (B,); ok (B,);
    spread (B,) the largest |Ritz value|).

    Each step applies sign * H to a block of b rows of the basis, one linear map from
    ``jax.linearize`` of the gradient at W (the forward and backward pass at W are computed
    once per solve, not once per HVP). From ``min_iter`` rows on, every step tests the Ritz
    residual bounds ||R_j s_i|| of the top k pairs (R_j the last block's triangular factor,
    s_i the last b entries of the Ritz vector in the basis) against tol * spread; the
    eigenproblem of T is solved at the smallest size of 16, 32, 64, ... that holds it, so a
    test costs far less than an HVP. Each point stops on its own test. ``true_resid``:
    the residuals are ||H v - lambda v|| (k more HVPs), else the last bounds.
    """
    jax, jnp = _jax()
    real = jnp.dtype(dtype)
    small_rel = 1e-12 if real == jnp.float64 else 1e-5
    steps = -(-m_max // b)                # block steps at most
    M = steps * b                         # rows of T at most
    rows = M + b                          # Q's rows: T's and the next block's
    sizes = sorted({s for s in (16, 32, 64, 128, 256, 512) if s < M} | {M})
    grads = jax.vmap(grad, in_axes=(0, None))

    def project(Z, Q, n):
        """Z (B, c, D) minus its components on Q's first n rows (B, >= n, D), one row at a
        time (modified Gram-Schmidt): each row is read twice in one fused pass, so the cost
        grows with the Krylov dimension reached, not with the cap."""
        if Q.shape[1] == 0:
            return Z

        def row(i, Z):
            q = jax.lax.dynamic_index_in_dim(Q, i, axis=1, keepdims=False)[:, None, :]
            return Z - jnp.sum(q * Z, axis=2, keepdims=True) * q
        return jax.lax.fori_loop(0, n, row, Z)

    def orthogonalised(Z, Q, n, extra):
        """Z against ``extra`` (B, L, D) and Q's first n rows, a second pass only where the
        first removed more than 1 - 1/sqrt(2) of a row's norm (Daniel-Gragg-Kaufman-Stewart:
        then one more pass restores orthogonality to rounding)."""
        def once(Z):
            return project(project(Z, extra, extra.shape[1]), Q, n)
        before = jnp.linalg.norm(Z, axis=2)
        Z = once(Z)
        again = jnp.any(jnp.linalg.norm(Z, axis=2) < before / math.sqrt(2))
        return jax.lax.cond(again, once, lambda Z: Z, Z)

    def random_unit(keys, row, Q, n, extra):
        """A unit direction orthogonal to Q's first n rows and ``extra``, drawn for ``row``,
        and whether one was left (False: the space is spent)."""
        z = jax.vmap(lambda kk: jax.random.normal(jax.random.fold_in(kk, row), (D,), real))(keys)
        z = orthogonalised(z[:, None], Q, n, extra)[:, 0]
        nrm = jnp.linalg.norm(z, axis=1, keepdims=True)
        return z / jnp.where(nrm > 0, nrm, 1), nrm[:, 0] > 1e-3

    def orthonormal(Z, scale, fallback):
        """Gram-Schmidt of Z's b rows (B, b, D) against each other (twice); a row that
        vanishes (norm <= small_rel * scale) is replaced by ``fallback(c, rows so far)`` ->
        (unit row, found), a row neither kept nor found by 0. Returns the rows, R (B, b, b)
        upper triangular with Z = R^T rows, and which rows are directions (B, b)."""
        out, good = [], []
        R = jnp.zeros((Z.shape[0], b, b), real)
        for c in range(b):
            z = Z[:, c]
            if out:
                basis = jnp.stack(out, axis=1)
                for _ in range(2):
                    coef = jnp.einsum("bnd,bd->bn", basis, z)
                    z = z - jnp.einsum("bn,bnd->bd", coef, basis)
                    R = R.at[:, :c, c].add(coef)
            r = jnp.linalg.norm(z, axis=1)
            tiny = r <= small_rel * jnp.where(scale > 0, scale, 1)
            fresh, found = jax.lax.cond(jnp.any(tiny), partial(fallback, c, list(out)),
                                        lambda z=z: (z, jnp.ones(Z.shape[0], bool)))
            R = R.at[:, c, c].set(jnp.where(tiny, 0, r))
            row = jnp.where(tiny[:, None], fresh, z / jnp.where(tiny, 1, r)[:, None])
            good.append(~tiny | found)
            out.append(jnp.where(good[-1][:, None], row, 0))
        return jnp.stack(out, axis=1), R, jnp.stack(good, axis=1)

    def ritz(T, m, valid):
        """The top k eigenpairs of each T_m (T's first m rows and columns less the rows that
        are no direction): values (B, k) descending, vectors (B, M, k) zero on the rows left
        out, the largest |Ritz value| (B,) and the rows kept (B,)."""
        def at(s):
            def solve(T, m, valid):
                inside = (jnp.arange(s)[None, :] < m[:, None]) & valid[:, :s]
                both = inside[:, :, None] & inside[:, None, :]
                Ts = jnp.where(both, T[:, :s, :s], 0)
                # the rows left out: decoupled, below the spectrum
                low = jnp.max(jnp.sum(jnp.abs(Ts), axis=2), axis=1) + 1
                Ts = Ts - jax.vmap(jnp.diag)(jnp.where(inside, 0, low[:, None]))
                vals, vecs = jnp.linalg.eigh(Ts)
                vals, vecs = vals[:, ::-1], vecs[:, :, ::-1]
                kept = jnp.sum(inside, axis=1)
                spread = jnp.max(jnp.where(jnp.arange(s)[None, :] < kept[:, None],
                                           jnp.abs(vals), 0), axis=1)
                vecs = jnp.where(inside[:, :, None], vecs[:, :, :k], 0)
                return (vals[:, :k], jnp.pad(vecs, ((0, 0), (0, M - s), (0, 0))), spread,
                        kept)
            return solve
        index = jnp.searchsorted(jnp.asarray(sizes), jnp.max(m))
        return jax.lax.switch(index, [at(s) for s in sizes], T, m, valid)

    def bounds(R, S, m):
        """||R S_last||: the Ritz residual bound of each pair, S_last the rows m-b..m-1."""
        last = jnp.take_along_axis(S, (m[:, None] - b + jnp.arange(b))[:, :, None], axis=1)
        return jnp.linalg.norm(jnp.einsum("bce,bek->bck", R, last), axis=1)

    def run(W, start, have_start, seed, streams, counter, salt, locked, data):
        B = W.shape[0]
        base = jax.random.fold_in(jax.random.fold_in(_key_of(seed), counter), salt)
        keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(streams)
        _, lin = jax.linearize(lambda X: grads(X, data), W)

        def apply(X):  # sign * H of each row of the blocks X (B, c, D)
            if X.shape[1] == 1:
                return sign * lin(X[:, 0])[:, None]
            return sign * jax.vmap(lin, in_axes=1, out_axes=1)(X)

        Q = jnp.zeros((B, rows, D), real)
        n0 = jnp.linalg.norm(start, axis=1, keepdims=True)
        use = have_start & (n0[:, 0] > 0)
        draws = jax.vmap(lambda kk: jax.vmap(lambda c: jax.random.normal(
            jax.random.fold_in(kk, c), (D,), real))(jnp.arange(b)))(keys)
        X0 = draws.at[:, 0].set(jnp.where(use[:, None], start / jnp.where(n0 > 0, n0, 1),
                                          draws[:, 0]))
        X0 = orthogonalised(X0, Q, 0, locked)
        X0, _, good0 = orthonormal(X0, jnp.ones(B, real),
                                   lambda c, out: (jnp.zeros((B, D), real), jnp.zeros(B, bool)))
        ok0 = good0[:, 0]
        Q = jax.lax.dynamic_update_slice_in_dim(Q, X0, 0, axis=1)
        valid = jnp.zeros((B, rows), bool).at[:, :b].set(good0)
        T = jnp.zeros((B, M + b, M + b), real)
        state = (0, Q, T, valid, jnp.zeros((B, b, b), real), jnp.zeros(B, jnp.int32), ~ok0,
                 jnp.zeros(B, bool), ok0, jnp.zeros((B, k), real))

        def cond(s):
            return (s[0] < steps) & ~jnp.all(s[6])

        def body(s):
            j, Q, T, valid, R_prev, m, done, conv, ok, est = s
            n = j * b
            X = jax.lax.dynamic_slice_in_dim(Q, n, b, axis=1)
            Z = apply(X)
            ok = ok & (done | jnp.all(jnp.isfinite(Z.reshape(B, -1)), axis=1))
            live = ~done & ok
            A = jnp.einsum("bcd,bed->bce", X, Z)
            A = 0.5 * (A + jnp.swapaxes(A, 1, 2))
            X_prev = jax.lax.dynamic_slice_in_dim(Q, jnp.maximum(n - b, 0), b, axis=1)
            Z = Z - jnp.einsum("bec,bed->bcd", A, X) - jnp.einsum("bce,bed->bcd", R_prev,
                                                                     X_prev)
            Z = orthogonalised(Z, Q, n + b, locked)
            scale = jnp.max(jnp.abs(A), axis=(1, 2)) + jnp.max(jnp.abs(R_prev), axis=(1, 2))

            def fresh(c, out):  # rare: drawn only when some point needs it
                extra = jnp.concatenate([locked] + [o[:, None] for o in out], axis=1)
                return random_unit(keys, n + b + c, Q, n + b, extra)

            X_next, R, good = orthonormal(Z, scale, fresh)
            m = jnp.where(live, n + b, m)
            keep = live[:, None, None]
            put = jax.lax.dynamic_update_slice
            T = put(T, jnp.where(keep, A, 0), (0, n, n))
            T = put(T, jnp.where(keep, R, 0), (0, n + b, n))
            T = put(T, jnp.where(keep, jnp.swapaxes(R, 1, 2), 0), (0, n, n + b))
            Q = jax.lax.dynamic_update_slice_in_dim(Q, jnp.where(keep, X_next, 0), n + b,
                                                    axis=1)
            valid = jax.lax.dynamic_update_slice_in_dim(valid, live[:, None] & good, n + b,
                                                        axis=1)
            test = (n + b >= max(k, min_iter)) | (j + 1 == steps)

            def check():
                _, S, spread, _ = ritz(T, m, valid)
                e = bounds(R, S, m)
                floor = jnp.where(spread > 0, spread, 1)
                return jnp.all(e <= tol * floor[:, None], axis=1), e
            now, e = jax.lax.cond(test, check, lambda: (jnp.zeros(B, bool), est))
            est = jnp.where(live[:, None], e, est)
            conv = jnp.where(live & test, now, conv)
            stop = live & (now | (j + 1 == steps))
            # the rows applied span the whole space (with the locked ones), or nothing is
            # left to apply: the Ritz pairs are exact
            spanned = jnp.sum(valid & (jnp.arange(rows) < n + b), axis=1) + \
                locked.shape[1] >= D
            exhausted = live & (spanned | ~jnp.any(good, axis=1))
            conv = conv | exhausted
            done = done | stop | exhausted | ~ok
            return j + 1, Q, T, valid, R, m, done, conv, ok, est

        _, Q, T, valid, _, m, _, conv, ok, est = jax.lax.while_loop(cond, body, state)
        vals, S, spread, kept = ritz(T, m, valid)

        def gather(i, V):  # the Ritz vectors, one basis row at a time up to m
            q = jax.lax.dynamic_index_in_dim(Q, i, axis=1, keepdims=False)
            s = jax.lax.dynamic_index_in_dim(S, i, axis=1, keepdims=False)
            return V + s[:, :, None] * q[:, None, :]
        V = jax.lax.fori_loop(0, jnp.max(m), gather, jnp.zeros((B, k, D), real))
        V = V / jnp.linalg.norm(V, axis=2, keepdims=True)
        big = jnp.take_along_axis(V, jnp.argmax(jnp.abs(V), axis=2)[:, :, None], axis=2)
        V = jnp.where(big < 0, -V, V)
        evals = jnp.where(jnp.arange(k)[None, :] < kept[:, None], vals, jnp.nan)
        if true_resid:
            AV = apply(V)
            resid = jnp.linalg.norm(AV - evals[:, :, None] * V, axis=2)
            ok = ok & jnp.all(jnp.isfinite(AV.reshape(B, -1)), axis=1)
        else:
            resid = est
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
        self.seed_words = _seed_words(int(self.lz["seed"]))
        self.streams = jnp.asarray((np.arange(B, dtype=np.uint64) + self.offset) % 2 ** 32,
                                   dtype=jnp.uint32)

    def _sharpness(self, state, t: int, rec: dict) -> dict:
        """The sharpness solve at step t for the live trajectories: records and v1."""
        jax, jnp = _jax()
        core, lz = self.core, self.lz
        run = core._lanczos_run(1, 1, int(lz["max_iter"]), int(lz["min_iter"]),
                                float(lz["tol"]), 1.0, 0, False)
        evals, evecs, _, _, conv, ok, _ = run(state["w"], state["v1"], state["have_v1"],
                                              self.seed_words, self.streams, t, 0,
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
                for name in _PLAIN["sharpness"]:
                    out[name][r] = np.where(alive, np.asarray(sh[name]), np.nan)
                out["sharpness_converged"][r] = np.asarray(sh["sharpness_converged"]) & alive
                if "top_eigenvalues" in out and out["top_eigenvalues"].shape[0]:
                    top = np.asarray(self._top_k(before, t, rec["norm2"]))
                    out["top_eigenvalues"][r] = np.where(alive[:, None], top, np.nan)
                self.rows["sharpness"] += 1
                before = solved
            if is_event["record"]:
                r = self.rows["record"]
                for name in _PLAIN["record"]:
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
