"""What docs/conventions.rst says of the XLA backend's bits, checked.

A loss with convolutions runs its batch one row at a time on the CPU, each row keyed by its
global index, so a row run alone (``first_trajectory`` = its index) gives the bits it has
inside the batch, its jitter included. Oracle: the same row alone. (No sharpness solves: a
Lanczos program would double the test's compile time, 5-6 s on the shared 2-core Xeon.)
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import conv_bn_loss

import pysharp as ps

jax = pytest.importorskip("jax")


@pytest.mark.skipif("jax.default_backend() != 'cpu'", reason="rows run apart on the CPU only")
def test_a_conv_networks_row_alone_has_its_bits_in_the_batch():
    from pysharp.models import from_jax

    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((6, 1, 4, 4)), rng.integers(0, 2, 6)

    model = from_jax(conv_bn_loss, {"c": rng.standard_normal((2, 1, 3, 3)),
                            "fc": rng.standard_normal((2, 2))}, X=X, y=y, check=False)
    assert model._core(np.dtype(np.float64), "jax").rows_apart
    W = model.initial_point() + 0.05 * rng.standard_normal((3, model.dim))
    lr = np.array([0.02, 0.05, 0.1])
    kw = {"wd": 1e-3, "steps": 8, "record_every": 4, "sharpness_every": 0, "theta_every": 8,
          "jitter": 1e-3, "seed": 7, "backend": "jax"}
    batch = ps.run_gd_wd(model, W, lr=lr, **kw)
    alone = ps.run_gd_wd(model, W[1:2], lr=lr[1:2], first_trajectory=1, **kw)
    for name in ("loss", "norm2", "eff_lr", "grad_norm", "theta"):
        np.testing.assert_array_equal(getattr(alone, name), getattr(batch, name)[:, 1:2],
                                      err_msg=name)
    np.testing.assert_array_equal(alone.w, batch.w[1:2])
    # the row's index keys its streams: keyed as row 0, the same row moves elsewhere
    other = ps.run_gd_wd(model, W[1:2], lr=lr[1:2], first_trajectory=0, **kw)
    assert not np.array_equal(other.w, alone.w)
