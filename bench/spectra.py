"""Hessian spectra benchmark: pysharp against PyHessian-style JAX (and PyTorch) peers.

BN linear regression (docs/theory.rst, "BN linear regression"), B points, spherical Hessian,
float64.
Every peer works on the very same points and Rademacher probes
(``pysharp.spectra.rademacher``) and its HVP is autodiff's forward-over-reverse
product, as in PyHessian and hessian-eigenthings. Accuracy is checked first
(against pysharp, which is itself tested against dense eigh); only then are the
times compared, as ratios peer time / pysharp time (> 1: pysharp is faster).

- ``hessian_spectrum``: every eigenvalue. Peer: jit(vmap(jax.hessian)) + eigvalsh.
- ``hessian_trace``: Hutchinson, P probes. Peer: jit(vmap) of P HVPs per point.
  Also reported: pysharp's Hutch++ error at the same number of HVPs.
- ``spectral_density``: SLQ, P probes x m Lanczos steps, full reorthogonalisation.
  Peers: "jax-jit" (one jit(vmap) over points x probes, lax.fori_loop over
  steps) and "jax-loop" (PyHessian's structure: Python loops over probes and
  steps calling a jitted HVP; timed on one point and scaled to B).

``python -m bench.spectra [--quick]``
"""

from __future__ import annotations

import numpy as np

from bench._common import start_benchmark, timed


def flag(load) -> str:
    return " !" if load is not None and load > 0.15 else ""


def make_jax(jax, Xc, y):
    """PyHessian-style kernels on the BN linear-regression loss in JAX."""
    jnp = jax.numpy
    Xc = jnp.asarray(Xc)
    u = jnp.asarray(y - y.mean())
    scale = 2.0 * float(np.var(y))

    def loss(w):
        z = Xc @ w
        return scale * (1.0 - z @ u / (jnp.linalg.norm(z) * jnp.linalg.norm(u)))

    grad = jax.grad(loss)

    def hvp(w, v):
        return jax.jvp(grad, (w,), (v,))[1]

    def spherical(w):
        return w / jnp.linalg.norm(w)

    @jax.jit
    def spectrum(W):
        H = jax.vmap(lambda w: jax.hessian(loss)(spherical(w)))(W)
        return jnp.linalg.eigvalsh(H)[:, ::-1]

    @jax.jit
    def hutchinson(W, Z):
        def one(w):
            th = spherical(w)
            return jax.vmap(lambda z: z @ hvp(th, z))(Z)
        return jax.vmap(one)(W)

    def lanczos(th, q0, steps):
        D = q0.shape[0]
        Q = jnp.zeros((steps + 1, D)).at[0].set(q0 / jnp.linalg.norm(q0))

        def body(j, carry):
            Q, a, b = carry
            q = Q[j]
            z = hvp(th, q)
            aj = q @ z
            z = z - aj * q - jnp.where(j > 0, b[j - 1], 0.0) * Q[j - 1]
            mask = (jnp.arange(steps + 1) <= j)[:, None]
            for _ in range(2):  # full reorthogonalisation against Q[0..j]
                z = z - (Q * mask).T @ ((Q * mask) @ z)
            bj = jnp.linalg.norm(z)
            # Breakdown (the Krylov space closed): stop this run, as pysharp does.
            live = bj > 1e-12 * (jnp.abs(aj) + jnp.where(j > 0, b[j - 1], 0.0))
            bj = jnp.where(live, bj, 0.0)
            q_next = jnp.where(live, z / jnp.where(live, bj, 1.0), 0.0)
            return Q.at[j + 1].set(q_next), a.at[j].set(aj), b.at[j].set(bj)

        _, a, b = jax.lax.fori_loop(0, steps, body, (Q, jnp.zeros(steps), jnp.zeros(steps)))
        T = jnp.diag(a) + jnp.diag(b[:-1], 1) + jnp.diag(b[:-1], -1)
        nodes, V = jnp.linalg.eigh(T)
        return nodes, V[0] ** 2

    def slq_jit(steps):
        @jax.jit
        def run(W, Z):
            return jax.vmap(lambda w: jax.vmap(lambda z: lanczos(spherical(w), z, steps))(Z))(W)
        return run

    hvp_jit = jax.jit(lambda th, v: hvp(th, v))

    def slq_loop(w, Z, steps):
        """PyHessian's loop: per probe, per step, one HVP call from Python."""
        th = spherical(jnp.asarray(w))
        out = []
        for z in Z:
            q = jnp.asarray(z / np.linalg.norm(z))
            Q, a, b = [q], [], []
            for j in range(steps):
                r = hvp_jit(th, Q[-1])
                aj = float(Q[-1] @ r)
                r = r - aj * Q[-1] - (b[-1] * Q[-2] if j > 0 else 0.0)
                for _ in range(2):
                    for qk in Q:
                        r = r - (qk @ r) * qk
                bj = float(jnp.linalg.norm(r))
                a.append(aj)
                if bj <= 1e-12 * (abs(aj) + (b[-1] if b else 0.0)):
                    break  # breakdown: the Krylov space closed
                b.append(bj)
                Q.append(r / bj)
            m = len(a)
            T = np.diag(a) + np.diag(b[:m - 1], 1) + np.diag(b[:m - 1], -1)
            nodes, V = np.linalg.eigh(T)
            pad = steps - m  # zero-weight slots, as pysharp's
            out.append((np.pad(nodes, (0, pad), mode="edge"), np.pad(V[0] ** 2, (0, pad))))
        return out

    return {"loss": jax.jit(jax.vmap(loss)), "spectrum": spectrum, "hutchinson": hutchinson,
            "slq_jit": slq_jit, "slq_loop": slq_loop}


def moments(nodes, weights, kmax=4):
    """(B, kmax + 1) quadrature moments averaged over probes."""
    nodes, weights = np.asarray(nodes), np.asarray(weights)
    return np.einsum("bpj,bpjk->bk", weights, nodes[..., None] ** np.arange(kmax + 1)) / \
        nodes.shape[1]


def main(argv=None) -> int:
    args, ps = start_benchmark(__doc__, argv, quick="B 16 points, one size")
    from pysharp.spectra import rademacher
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
    except ImportError:
        print("jax: not installed; nothing to compare against")
        return 0
    try:
        import torch  # noqa: F401
        print("torch: installed, but the PyTorch peer is not implemented here (JAX only)")
    except ImportError:
        print("torch: not installed (skipped)")

    B = 16 if args.quick else 64
    P = 16
    sizes = [(40, 20)] if args.quick else [(40, 20), (200, 100)]
    threads = ps.build_info()["max_threads"]
    print(f"pysharp {ps.__version__}, jax {jax.__version__}, threads {threads}"
          f"; B {B} points, P {P} probes, float64, spherical Hessian")
    for d, n in sizes:
        model = ps.BNLinearRegression.synthetic(d=d, n=n, seed=0)
        D = model.dim
        steps = min(80, D)
        W = model.random_point(B, seed=1, norm=3.0)
        jx = make_jax(jax, model.X - model.X.mean(axis=0), model.y)
        dev = np.max(np.abs(np.asarray(jx["loss"](W)) - model.loss(W)))
        if dev > 1e-12:
            print(f"  *** JAX loss disagrees with pysharp ({dev:.1e}) ***")
            return 1
        print(f"\nBN linear regression d {d} n {n} (D {D}), steps {steps}")

        # -- full spectrum
        ref = ps.hessian_spectrum(model, W).eigenvalues
        ev = np.asarray(jx["spectrum"](W))
        err = np.max(np.abs(ev - ref)) / np.max(np.abs(ref))
        t_ps, l1 = timed(lambda: ps.hessian_spectrum(model, W))
        t_jx, l2 = timed(lambda: jx["spectrum"](W).block_until_ready())
        print(f"  hessian_spectrum  pysharp {t_ps * 1e3:8.2f} ms{flag(l1)}  jax-jit "
              f"{t_jx * 1e3:8.2f} ms{flag(l2)}  jax/pysharp {t_jx / t_ps:6.2f}"
              f"  (max rel dev {err:.1e})")

        # -- trace
        exact = ps.hessian_trace(model, W, method="exact").estimate
        Z = rademacher(0, P, D, stream=0x485554)  # the probes of method="hutchinson"
        hut = ps.hessian_trace(model, W, n_probes=P, method="hutchinson")
        jt = np.asarray(jx["hutchinson"](W, Z)).mean(axis=1)
        err = np.max(np.abs(jt - hut.estimate)) / np.max(np.abs(hut.estimate))
        if err > 1e-10:
            print(f"  *** JAX Hutchinson disagrees with pysharp ({err:.1e}) ***")
            return 1
        t_ps, l1 = timed(lambda: ps.hessian_trace(model, W, n_probes=P, method="hutchinson"))
        t_jx, l2 = timed(lambda: jx["hutchinson"](W, Z).block_until_ready())
        hpp = ps.hessian_trace(model, W, n_probes=P, method="hutch++")
        t_pp, _ = timed(lambda: ps.hessian_trace(model, W, n_probes=P, method="hutch++"))
        rms = lambda e: float(np.sqrt(np.mean((e - exact) ** 2)))  # noqa: E731
        print(f"  hessian_trace     pysharp {t_ps * 1e3:8.2f} ms{flag(l1)}  jax-jit "
              f"{t_jx * 1e3:8.2f} ms{flag(l2)}  jax/pysharp {t_jx / t_ps:6.2f}"
              f"  (rel dev {err:.1e})")
        print(f"    error vs exact trace over the B points, {P} HVPs each: Hutchinson rms "
              f"{rms(hut.estimate):.3g}, Hutch++ rms {rms(hpp.estimate):.3g} "
              f"({t_pp * 1e3:.2f} ms); mean |tr| {np.mean(np.abs(exact)):.3g}")

        # -- spectral density
        dens = ps.spectral_density(model, W, n_probes=P, steps=steps)
        Zs = rademacher(0, P, D)  # the SLQ probes
        run = jx["slq_jit"](steps)
        jn, jw = (np.asarray(x) for x in run(W, Zs))
        m_ps, m_jx = moments(dens.nodes, dens.weights), moments(jn, jw)
        scale = np.max(np.abs(m_ps), axis=0)
        err = np.max(np.abs(m_jx - m_ps) / scale)
        if err > 1e-8:
            print(f"  *** JAX SLQ moments disagree with pysharp ({err:.1e}) ***")
            return 1
        t_ps, l1 = timed(lambda: ps.spectral_density(model, W, n_probes=P, steps=steps))
        # The peer stops at nodes and weights: time pysharp's quadrature alone too
        # (a 2-point grid makes the density's cost nil).
        tiny_grid = np.array([0.0, 1.0])
        t_q, l0 = timed(lambda: ps.spectral_density(model, W, n_probes=P, steps=steps,
                                                    grid=tiny_grid, sigma=1.0))
        t_jx, l2 = timed(lambda: jax.block_until_ready(run(W, Zs)))
        loop_out = jx["slq_loop"](W[0], Zs, steps)
        lm = moments(np.array([[o[0] for o in loop_out]]), np.array([[o[1] for o in loop_out]]))
        lerr = np.max(np.abs(lm[0] - m_ps[0]) / scale)
        t_loop, l3 = timed(lambda: jx["slq_loop"](W[0], Zs, steps), repeats=1)
        print(f"  spectral_density  pysharp {t_q * 1e3:8.2f} ms{flag(l0)}  jax-jit "
              f"{t_jx * 1e3:8.2f} ms{flag(l2)}  jax/pysharp {t_jx / t_q:6.2f}  "
              f"(nodes + weights; moments 0-4 max rel dev {err:.1e})")
        print(f"    pysharp with the density on its default 501-point grid {t_ps * 1e3:.2f} ms"
              f"{flag(l1)}")
        print(f"    jax-loop (PyHessian structure) {t_loop * B:8.2f} s for B points (1 timed, x B)"
              f"{flag(l3)}  loop/pysharp {t_loop * B / t_q:8.0f}  (rel dev {lerr:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
