// The loss every BatchNorm model here reduces to.
//
// A predictor z (n outputs) normalised by batch statistics, with the BN scale
// and shift fixed to the targets' std and mean, has square loss
//     L(z) = 2 var(y) (1 - cos(z - mean z, y - mean y))
//          = (scale / 2) || zc / ||zc|| - u ||^2,
// with zc = z - mean(z), u = (y - mean y) / ||y - mean y|| and
// scale = 2 var(y). The second form is the one computed: it keeps full
// relative accuracy near interpolation, where 1 - cos cancels.
#pragma once

#include "pysharp/core/jet.hpp"

namespace pysharp {

// Writes L into *loss and dL/dz into g (g may alias z). Returns false (per
// lane), leaving *loss and g unspecified, when zc is zero to working precision
// (BatchNorm is undefined there): ||zc||^2 <= floor2, the caller's bound on the
// rounding error of z itself, or ||zc|| within a few ulps of ||z|| (centring
// noise). u, scale and F are reals, or lane blocks where every lane has its
// own (ghost BN of a lane block: each lane its own batch).
template <class S, class U, class Scale, class F>
PYSHARP_HD mask_t<S> bn_cosine_loss_grad(const S* z, const U* u, const Scale& scale, int n,
                                         const F& floor2, S* loss, S* g) {
  using Real = lane_real_t<value_t<S>>;
  S mean = Real(0);
  value_t<S> z2 = Real(0);
  for (int i = 0; i < n; ++i) {
    mean += z[i];
    z2 += value_of(z[i]) * value_of(z[i]);
  }
  mean = mean * (Real(1) / Real(n));
  S r2 = Real(0);
  for (int i = 0; i < n; ++i) {
    g[i] = z[i] - mean;
    r2 += g[i] * g[i];
  }
  const Real noise = Real(8) * Real(n) * machine_eps<Real>();
  const mask_t<S> defined = (value_of(r2) > floor2) & (value_of(r2) > noise * noise * z2);
  const S inv_r = Real(1) / sqrt_(r2);
  S cos_zu = Real(0);
  S err2 = Real(0);
  for (int i = 0; i < n; ++i) {
    g[i] = g[i] * inv_r;  // now the unit, centred direction of z
    cos_zu += g[i] * u[i];
    const S e = g[i] - u[i];
    err2 += e * e;
  }
  *loss = err2 * (Real(0.5) * scale);
  // dL/dz = -scale (u - cos * zhat) / ||zc||, already centred.
  for (int i = 0; i < n; ++i) g[i] = (cos_zu * g[i] - u[i]) * inv_r * scale;
  return defined;
}

}  // namespace pysharp
