// Dense products of a row-major data matrix X (n, d) with parameters, written
// once for scalars, jets and lane blocks.
//
// Each output is summed in index order, exactly as the plain loop would, but
// a block of outputs advances together: their sums are independent chains, so the
// multiply-adds overlap instead of waiting on each other's latency, and each
// loaded operand serves the whole block (register blocking). On lane blocks
// this is a small GEMM of X with W trajectories. The block's size follows the
// target's vector registers and the size of the values summed (dense_block), so the
// order of every sum, hence every bit, is the same whatever the target's block.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/core/jet.hpp"

#if !defined(__CUDACC__)
#include "pysharp/core/lanes.hpp"  // kSimdRegisters
#endif

namespace pysharp {

// Vector registers one value of S takes: one for a scalar or a lane block, N + 1 for a
// jet of order N of them.
template <class S>
inline constexpr int registers_of =
    static_cast<int>(sizeof(S) / (sizeof(lane_real_t<S>) * lane_width<S>));

// Outputs a block of matvec_rows / matvec_cols advances together when it sums values of
// type S, k = registers_of<S> vector registers each (B k accumulators beside one operand,
// k, and one broadcast element of X: B k + k + 1 <= R registers). On 16 registers (AVX2,
// SSE2) twelve accumulators, 12 / k outputs: twelve independent multiply-add chains cover
// the FMA's latency (4 cycles on two ports) with room to spare, and jets fit (a block of 8
// jets of order 1 or 2, 16 or 24 accumulators, spilled). On 32 (AVX-512, NEON) 8 outputs
// for every S, up to 24 accumulators: 12 / k there was 2-5 % slower and 12 jets of order 1
// 15-36 %. Measured on BN linear regression d 40 n 20 and d 100 n 200, one core, against a
// block of 8 for every S (before): AVX2 engine 1.02-1.04x, loss and gradient 1.04x, HVP
// 1.05-1.16x, third order 1.21x; SSE2 1.0x. A CUDA thread's registers hold one
// trajectory's scalars: 8 there.
#if defined(__CUDACC__)
template <class S>
inline constexpr int dense_block = 8;
#else
template <class S>
inline constexpr int dense_block_goal = kSimdRegisters >= 32 ? 8 : 12 / registers_of<S>;
template <class S>
inline constexpr int dense_block = dense_block_goal<S> < (kSimdRegisters - 1) / registers_of<S> - 1
                                       ? dense_block_goal<S>
                                       : (kSimdRegisters - 1) / registers_of<S> - 1;
#endif

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

// sum_k value(w[k])^2 in dot_split's order, for a sum that only sets a threshold (a
// rounding floor): its order reaches no result, so it need not be one chain.
template <class S>
PYSHARP_HD value_t<S> squares_split(const S* w, int d) {
  using T = value_t<S>;
  T p[4] = {T(0), T(0), T(0), T(0)};
  int k = 0;
  for (; k + 4 <= d; k += 4)
    for (int b = 0; b < 4; ++b) p[b] += value_of(w[k + b]) * value_of(w[k + b]);
  for (; k < d; ++k) p[0] += value_of(w[k]) * value_of(w[k]);
  return (p[0] + p[1]) + (p[2] + p[3]);
}

// The blocks below size P, largest first, each at most once: block(size, i) for those
// that fit in [i, n), advancing i. Every remainder of a block of K <= 2 P outputs is
// covered.
template <int P, class Block>
PYSHARP_HD void dense_tail(int n, int& i, Block&& block) {
  if constexpr (P >= 1) {
    if (i + P <= n) {
      block(std::integral_constant<int, P>{}, i);
      i += P;
    }
    dense_tail<P / 2>(n, i, block);
  }
}

// The largest power of two below k (k >= 2).
PYSHARP_HD constexpr int power_of_two_below(int k) {
  int p = 1;
  while (2 * p < k) p *= 2;
  return p;
}

// Calls block(size, i) for consecutive blocks [i, i + size) covering [0, n),
// size a std::integral_constant: K at a time, then powers of two below K for
// the remainder (n = 20, K = 12: 12 + 8; K = 6: 6 + 6 + 6 + 2), so that a short
// tail is still several independent chains rather than one latency-bound chain
// per output. The blocks are forced inline: as calls (GCC's choice), the
// accumulators went through the stack and BN linreg's direct engine lost 3-9 %.
template <int K, class Block>
PYSHARP_HD void for_each_dense_block(int n, Block&& block) {
  int i = 0;
  for (; i + K <= n; i += K) block(std::integral_constant<int, K>{}, i);
  if constexpr (K > 1) dense_tail<power_of_two_below(K)>(n, i, block);
}

// z[i] = sum_j X[i, j] w[j] for i < n.
template <class S, class Real>
PYSHARP_HD void matvec_rows(const Real* X, int n, int d, const S* w, S* z) {
  for_each_dense_block<dense_block<S>>(n, [&](auto size, int i) PYSHARP_INLINE_LAMBDA {
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
  for_each_dense_block<dense_block<G>>(d, [&](auto size, int j) PYSHARP_INLINE_LAMBDA {
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
