// Dense products of a row-major data matrix X (n, d) with parameters, written
// once for scalars, jets and lane blocks.
//
// Each output is summed in index order, exactly as the plain loop would, but
// kBlock outputs advance together: their sums are independent chains, so the
// multiply-adds overlap instead of waiting on each other's latency, and each
// loaded operand serves kBlock of them (register blocking). On lane blocks
// this is a small GEMM of X with W trajectories.
#pragma once

#include "pysharp/core/jet.hpp"

namespace pysharp {

inline constexpr int kDenseBlock = 8;

// sum_k w[k] x[k] as four interleaved partial sums, added at the end: four
// independent multiply-add chains instead of one latency-bound chain.
template <class S, class Real>
PYSHARP_HD S dot_split(const S* w, const Real* x, int d) {
  S p[4] = {S(Real(0)), S(Real(0)), S(Real(0)), S(Real(0))};
  int k = 0;
  for (; k + 4 <= d; k += 4)
    for (int b = 0; b < 4; ++b) p[b] += w[k + b] * x[k + b];
  for (; k < d; ++k) p[0] += w[k] * x[k];
  return (p[0] + p[1]) + (p[2] + p[3]);
}

// z[i] = sum_j X[i, j] w[j] for i < n.
template <class S, class Real>
PYSHARP_HD void matvec_rows(const Real* X, int n, int d, const S* w, S* z) {
  int i = 0;
  for (; i + kDenseBlock <= n; i += kDenseBlock) {
    S acc[kDenseBlock];
    for (int b = 0; b < kDenseBlock; ++b) acc[b] = S(Real(0));
    const Real* x = X + static_cast<long long>(i) * d;
    for (int j = 0; j < d; ++j)
      for (int b = 0; b < kDenseBlock; ++b) acc[b] += w[j] * x[static_cast<long long>(b) * d + j];
    for (int b = 0; b < kDenseBlock; ++b) z[i + b] = acc[b];
  }
  for (; i < n; ++i) {
    const Real* x = X + static_cast<long long>(i) * d;
    S acc = S(Real(0));
    for (int j = 0; j < d; ++j) acc += w[j] * x[j];
    z[i] = acc;
  }
}

// g[j] = sum_i r[i] X[i, j] for j < d. Where r holds jets, g may hold their
// coefficient type: it then gets only the top coefficient of each sum, for a
// third of the work at order 2 and half at order 1.
template <class S, class G, class Real>
PYSHARP_HD void matvec_cols(const Real* X, int n, int d, const S* r, G* g) {
  int j = 0;
  for (; j + kDenseBlock <= d; j += kDenseBlock) {
    G acc[kDenseBlock];
    for (int b = 0; b < kDenseBlock; ++b) acc[b] = G(Real(0));
    for (int i = 0; i < n; ++i) {
      const G& ri = coefficient_as<G>(r[i]);
      const Real* x = X + static_cast<long long>(i) * d + j;
      for (int b = 0; b < kDenseBlock; ++b) acc[b] += ri * x[b];
    }
    for (int b = 0; b < kDenseBlock; ++b) g[j + b] = acc[b];
  }
  for (; j < d; ++j) {
    G acc = G(Real(0));
    for (int i = 0; i < n; ++i)
      acc += coefficient_as<G>(r[i]) * X[static_cast<long long>(i) * d + j];
    g[j] = acc;
  }
}

}  // namespace pysharp
