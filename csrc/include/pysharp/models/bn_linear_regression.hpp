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
  int n;
  int d;

  PYSHARP_HD int dim() const { return d; }
  PYSHARP_HD int work_size() const { return n; }

  // L(w) into *loss, grad L(w) into g (length d); work holds n scalars.
  // Returns false where Xc w = 0.
  template <class S>
  PYSHARP_HD bool loss_grad(const S* w, S* loss, S* g, S* work) const {
    for (int i = 0; i < n; ++i) {
      const Real* x = Xc + static_cast<long long>(i) * d;
      S z = Real(0);
      for (int j = 0; j < d; ++j) z += w[j] * x[j];
      work[i] = z;
    }
    if (!bn_cosine_loss_grad(work, u, scale, n, loss, work)) return false;
    for (int j = 0; j < d; ++j) g[j] = Real(0);
    for (int i = 0; i < n; ++i) {
      const Real* x = Xc + static_cast<long long>(i) * d;
      for (int j = 0; j < d; ++j) g[j] += work[i] * x[j];
    }
    return true;
  }
};

}  // namespace pysharp
