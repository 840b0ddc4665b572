// Dense products of a row-major data matrix X (n, d) with parameters, written
// once for scalars, jets and lane blocks.
//
// Each output is summed in index order, exactly as the plain loop would, but
// kBlock outputs advance together: their sums are independent chains, so the
// multiply-adds overlap instead of waiting on each other's latency, and each
// loaded operand serves kBlock of them (register blocking). On lane blocks
// this is a small GEMM of X with W trajectories.
#pragma once

#include "pysharp/core/std.hpp"

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

// Calls block(size, i) for consecutive blocks [i, i + size) covering [0, n),
// size a std::integral_constant: kDenseBlock at a time, then 4, 2 and 1 for
// the remainder, so that a short tail (n = 20: 8 + 8 + 4) is still several
// independent chains rather than one latency-bound chain per output. The
// blocks are forced inline: as calls (GCC's choice), the accumulators went
// through the stack and BN linreg's direct engine lost 3-9 %.
template <class Block>
PYSHARP_HD void for_each_dense_block(int n, Block&& block) {
  int i = 0;
  for (; i + kDenseBlock <= n; i += kDenseBlock)
    block(std::integral_constant<int, kDenseBlock>{}, i);
  if (i + 4 <= n) {
    block(std::integral_constant<int, 4>{}, i);
    i += 4;
  }
  if (i + 2 <= n) {
    block(std::integral_constant<int, 2>{}, i);
    i += 2;
  }
  if (i < n) block(std::integral_constant<int, 1>{}, i);
}

// z[i] = sum_j X[i, j] w[j] for i < n.
template <class S, class Real>
PYSHARP_HD void matvec_rows(const Real* X, int n, int d, const S* w, S* z) {
  for_each_dense_block(n, [&](auto size, int i) PYSHARP_INLINE_LAMBDA {
    constexpr int B = decltype(size)::value;
    S acc[B];
    for (int b = 0; b < B; ++b) acc[b] = S(Real(0));
    const Real* x = X + static_cast<long long>(i) * d;
    for (int j = 0; j < d; ++j)
      for (int b = 0; b < B; ++b) acc[b] += w[j] * x[static_cast<long long>(b) * d + j];
    for (int b = 0; b < B; ++b) z[i + b] = acc[b];
  });
}

// g[j] = sum_i r[i] X[i, j] for j < d. Where r holds jets, g may hold their
// coefficient type: it then gets only the top coefficient of each sum, for a
// third of the work at order 2 and half at order 1.
template <class S, class G, class Real>
PYSHARP_HD void matvec_cols(const Real* X, int n, int d, const S* r, G* g) {
  for_each_dense_block(d, [&](auto size, int j) PYSHARP_INLINE_LAMBDA {
    constexpr int B = decltype(size)::value;
    G acc[B];
    for (int b = 0; b < B; ++b) acc[b] = G(Real(0));
    for (int i = 0; i < n; ++i) {
      const G& ri = coefficient_as<G>(r[i]);
      const Real* x = X + static_cast<long long>(i) * d + j;
      for (int b = 0; b < B; ++b) acc[b] += ri * x[b];
    }
    for (int b = 0; b < B; ++b) g[j + b] = acc[b];
  });
}

}  // namespace pysharp
