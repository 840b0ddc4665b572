"""The register blocks of core/dense.hpp on every mix of blocks their sizes take.

matvec_rows (z = Xc w, n outputs) and matvec_cols (g = Xc^T r, d outputs) advance
``dense_block<S>`` outputs at a time, a count set per target from its vector registers and the
size of the values summed (12 lane blocks, 6 jets of order 1 and 4 of order 2 on the
16-register targets, 8 of each on AVX-512), and cover the remainder with blocks of 8, 4, 2 and
1. Every output count from 2 to 27 takes a different mix (1 and 2 are the tails of 13 and
14); each must give BN linear
regression's loss, gradient, HVP and third order as the NumPy oracle does (its hand-derived
HVP, a complex step for the third order), under whichever target the core runs (CI runs
tests/csrc under each PYSHARP_CPU_TARGET). The blocks never change the order of a sum, so a
row alone and the same row in a batch agree bit for bit as well.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cases import rel_err

import pysharp as ps
from pysharp.reference import BNLinearRegressionReference

pytest.importorskip("pysharp._core")

# (n, d): every n in 3 .. 27 beside d = 11, every d in 2 .. 27 beside n = 13 (n = 2 or d = 1
# has a zero gradient, all rounding, which no oracle matches to a relative bound).
SHAPES = [(n, 11) for n in range(3, 28)] + [(13, d) for d in range(2, 28)]


@pytest.mark.parametrize("n, d", SHAPES)
def test_every_block_mix_matches_the_oracle(n, d):
    rng = np.random.default_rng(1000 * n + d)
    X = rng.standard_normal((n, d))
    y = rng.standard_normal(n)
    model = ps.BNLinearRegression(X, y)
    ref = BNLinearRegressionReference(X, y)
    B = 11  # whole lane blocks and a partial one on every target
    W = rng.standard_normal((B, d))
    V = rng.standard_normal((B, d))
    loss, grad = model.loss_and_grad(W)
    hv, third = model.hvp(W, V), model.third(W, V)
    assert rel_err(loss, ref.loss(W)) < 1e-12
    assert rel_err(grad, ref.grad(W)) < 1e-12
    assert rel_err(hv, ref.hvp(W, V)) < 1e-12
    assert rel_err(third, ref.third(W, V)) < 1e-9
    b = B - 1  # the partial block's last row, alone
    l1, g1 = model.loss_and_grad(W[b])
    assert l1 == loss[b]
    np.testing.assert_array_equal(g1, grad[b])
    np.testing.assert_array_equal(model.hvp(W[b], V[b]), hv[b])
    np.testing.assert_array_equal(model.third(W[b], V[b]), third[b])
