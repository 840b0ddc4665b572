"""Run by .ci/run in an install without pysharp._core: the fallback must carry the API."""

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
print(f"no-extension install OK: backend {tr.meta['backend']}, EoS entry step "
      f"{tr.eos_entry_step}, sharpness {sh.eigenvalues[0]:.4f}")
