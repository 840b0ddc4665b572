// The 3-D toy loss (docs/theory.rst, "The 3-D toy loss"): with
// (x, y, z) = w / ||w||, L(w) = (1 + c z^2) (x - y)^2. Its minimisers on the
// sphere form the great circle x = y; spherical sharpness 4 (1 + c z^2) is least at z = 0.
#pragma once

#include "pysharp/model.hpp"

namespace pysharp {

template <class Real>
struct Toy3D {
  Real c;

  PYSHARP_HD int dim() const { return 3; }
  PYSHARP_HD int work_size() const { return 0; }

  // Returns false at w = 0.
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* /*work*/) const {
    const S r2 = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
    const mask_t<S> defined = value_of(r2) > Real(0);
    const S inv_r = Real(1) / sqrt_(r2);
    const S x = w[0] * inv_r, y = w[1] * inv_r, z = w[2] * inv_r;
    const S diff = x - y;
    const S a = Real(1) + c * z * z;
    *loss = a * diff * diff;
    // q = gradient of the polynomial in (x, y, z); grad L = (I - t t^T) q / ||w||.
    const S q0 = Real(2) * a * diff;
    const S q2 = Real(2) * c * z * diff * diff;
    const S radial = (x - y) * q0 + z * q2;
    g[0] = (q0 - radial * x) * inv_r;
    g[1] = (-q0 - radial * y) * inv_r;
    g[2] = (q2 - radial * z) * inv_r;
    return defined;
  }
};

// The fields bound by name (pysharp/model.hpp): the header loads at run time too.
PYSHARP_MODEL(Toy3D, PYSHARP_SCALAR(c))

}  // namespace pysharp
