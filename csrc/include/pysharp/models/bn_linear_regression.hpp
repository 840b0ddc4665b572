// BN linear regression (DESIGN.md section 2).
//
// z = Xc w with Xc the column-centred data; the prediction batch-normalises z
// and rescales it to the targets' mean and std, so L depends on w only
// through the direction of Xc w: L(w) = 2 var(y) (1 - cos(Xc w, y - mean y)).
#pragma once

#include "pysharp/core/bn_cosine.hpp"

namespace pysharp {

template <class Real>
struct BNLinearRegression {
  const Real* Xc;  // (n, d) row-major, columns centred
  const Real* u;   // (n,) (y - mean y) / ||y - mean y||
  Real scale;      // 2 var(y)
  Real xc_fro2;    // ||Xc||_F^2, for the rounding floor of Xc w
  int n;
  int d;

  PYSHARP_HD int dim() const { return d; }
  PYSHARP_HD int work_size() const { return n; }

  // L(w) into *loss, grad L(w) into g (length d); work holds n scalars.
  // Returns false where Xc w = 0 to working precision: ||Xc w|| below the
  // rounding error of the product, ~ d eps ||Xc||_F ||w||.
  template <class S>
  PYSHARP_HD bool loss_grad(const S* w, S* loss, S* g, S* work) const {
    Real w2 = Real(0);
    for (int j = 0; j < d; ++j) w2 += value_of(w[j]) * value_of(w[j]);
    const Real err = Real(d) * machine_eps<Real>();
    const Real floor2 = err * err * xc_fro2 * w2;
    for (int i = 0; i < n; ++i) {
      const Real* x = Xc + static_cast<long long>(i) * d;
      S z = Real(0);
      for (int j = 0; j < d; ++j) z += w[j] * x[j];
      work[i] = z;
    }
    if (!bn_cosine_loss_grad(work, u, scale, n, floor2, loss, work)) return false;
    for (int j = 0; j < d; ++j) g[j] = Real(0);
    for (int i = 0; i < n; ++i) {
      const Real* x = Xc + static_cast<long long>(i) * d;
      for (int j = 0; j < d; ++j) g[j] += work[i] * x[j];
    }
    return true;
  }
};

}  // namespace pysharp
