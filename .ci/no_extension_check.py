"""Run by .ci/run in an install without pysharp._core: the fallback must carry the API,
and refuse, naming what is missing, what it does not cover."""

import numpy as np

import pysharp as ps

report = ps.backends()
assert not report["cpp"]["available"], report["cpp"]
assert report["numba"]["available"], report["numba"]
model = ps.BNLinearRegression.synthetic()
w0 = model.random_point(seed=0, norm=10.0)
tr = ps.run_gd_wd(model, w0, 0.5, 2e-4, 2000, record_every=10, sharpness_every=500)
assert tr.meta["backend"] == "numba" and not tr.diverged
sh = ps.spherical_sharpness(model, w0)
g = model.grad(w0)
assert abs(g @ w0) < 1e-12 * np.linalg.norm(g) * np.linalg.norm(w0)  # scale invariance

# Not covered by the fallback: float32, the square-loss models and SGD.
try:
    model.grad(w0.astype(np.float32))
except ps.BackendUnavailable as exc:
    assert "float32" in str(exc), exc
else:
    raise AssertionError("float32 on the numba fallback was not refused")
lin = ps.LinearRegression(np.eye(3), np.ones(3))
for call in (lambda: lin.loss(np.zeros(3)),
             lambda: ps.run_sgd(lin, np.zeros(3), 0.1, 1, 5)):
    try:
        call()
    except ImportError as exc:
        assert "pysharp._core" in str(exc), exc
    else:
        raise AssertionError("a square-loss call ran without the compiled core")
print(f"no-extension install OK: backend {tr.meta['backend']}, EoS entry step "
      f"{tr.eos_entry_step}, sharpness {sh.eigenvalues[0]:.4f}")
