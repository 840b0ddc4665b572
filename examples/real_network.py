"""A scale-invariant CNN written in plain JAX, run by pysharp in XLA: GD+WD at four learning
rates in one batched run, with the spherical sharpness tracked (docs/tutorials/real_networks.rst).

Run it: ``python examples/real_network.py`` (about a minute on 2 cores, most of it JAX
compiling the network three times: the gradient, the engine's step, the Lanczos solve).
"""

from __future__ import annotations

import sys

import numpy as np


def images(n: int = 96, classes: int = 4, seed: int = 0):
    """n noisy 8 x 8 images of ``classes`` fixed random templates, and their labels."""
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((classes, 1, 8, 8))
    y = np.arange(n) % classes
    return templates[y] + 0.8 * rng.standard_normal((n, 1, 8, 8)), y


def cnn_loss(params, X, y):
    """Two 3x3 conv layers, each with BatchNorm over the batch (no affine, no epsilon), a
    mean pool and a BN-normalised linear read-out: invariant to the scale of every
    parameter array. Integer-label cross-entropy."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def bn(z, axes):
        zc = z - z.mean(axes, keepdims=True)
        return zc / jnp.sqrt((zc * zc).mean(axes, keepdims=True))

    z = jax.nn.relu(bn(lax.conv_general_dilated(X, params["conv1"], (1, 1), "SAME"), (0, 2, 3)))
    z = jax.nn.relu(bn(lax.conv_general_dilated(z, params["conv2"], (1, 1), "SAME"), (0, 2, 3)))
    logits = 4.0 * bn(z.mean((2, 3)) @ params["head"], (0,))
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])


def init_params(seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"conv1": rng.standard_normal((8, 1, 3, 3)), "conv2": rng.standard_normal((8, 8, 3, 3)),
            "head": rng.standard_normal((8, 4))}


def main(steps: int = 1500, n: int = 96) -> dict:
    import pysharp as ps

    X, y = images(n)
    model = ps.models.from_jax(cnn_loss, init_params(), groups="leaves", X=X, y=y)
    print(model)                                     # leaves=3, dim=728, groups=3
    w0 = model.initial_point()
    lrs = np.array([0.05, 0.1, 0.2, 0.4])
    W0 = np.repeat(w0[None], len(lrs), axis=0)       # one start, four learning rates
    tr = ps.run_gd_wd(model, W0, lr=lrs, wd=5e-2, steps=steps, record_every=10,
                      sharpness_every=50)
    for b, lr in enumerate(lrs):
        after = tr.sharpness_steps >= max(tr.eos_entry_step[b], 0)
        ratio = np.nanmedian(tr.eos_ratio[after, b]) if tr.eos_entry_step[b] >= 0 else np.nan
        print(f"lr {lr:4.2f}: loss {tr.loss[0, b]:.3f} -> {tr.loss[-1, b]:.2e}, EoS entry at "
              f"step {tr.eos_entry_step[b]:5d}, then eff. LR x sharpness {ratio:.3f} (median), "
              f"sharpness {tr.sharpness[0, b]:.1f} -> {tr.sharpness[-1, b]:.1f}")
    params = model.unravel(tr.w[-1])                 # the trained pytree of the last lr
    print("per-layer squared norms at the end:", tr.group_norm2[-1, -1].round(3))
    return {"trajectory": tr, "params": params, "model": model}


if __name__ == "__main__":
    main(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
