// CPU driver of stochastic Lanczos quadrature (engine/slq.hpp): batched over
// points x probes in lane blocks, OpenMP over blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/batched.hpp"
#include "pysharp/engine/slq.hpp"

namespace pysharp::cpu {

// SLQ for B points x P probes: the B * P (point, probe) problems fill the SIMD
// lanes of blocks (OpenMP over blocks); probe p is the same Rademacher vector
// at every point. Per problem (row-major (B, P, steps)): alpha, beta of the
// Lanczos tridiagonal, its Gauss nodes (ascending) and weights; count (B, P)
// the Lanczos steps taken (< steps after a breakdown: the quadrature is then
// exact, the remaining nodes repeat the largest one with weight 0).
// ok[b] = 0 where the model is undefined at point b.
template <class Model, class Real>
void slq_batch(const Model& m, const Real* W, std::int64_t B, int P, int steps,
               std::uint64_t seed, Real* alpha, Real* beta, Real* nodes, Real* weights,
               int* count, std::uint8_t* ok) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim(), N = B * P;
  std::fill(ok, ok + B, std::uint8_t(1));
  // Per-block buffers: a block's Lanczos run outweighs their allocation.
  auto no_scratch = [] { return 0; };
  for_each_block<L>(N, worth_threads(m, 3 * N * steps), no_scratch,
                         [&](const std::int64_t* pairs, int lanes, int&) {
    std::vector<V> w(D), Q(slq_basis_size(static_cast<int>(D), steps)), a(steps), b(steps);
    std::vector<Jet<V, 1>> jets(jet_scratch_size(m));
    std::vector<Real> d(steps), e(steps), wt(steps);
    std::int64_t rows[L];
    for (int l = 0; l < L; ++l) rows[l] = pairs[l] / P;
    gather_rows(W, D, rows, lanes, w.data());
    for (std::int64_t i = 0; i < D; ++i)
      for (int l = 0; l < L; ++l)
        set_lane(Q[i], l,
                 static_cast<Real>(rademacher(seed, kSlqStream,
                                              static_cast<std::uint64_t>(pairs[l] % P),
                                              static_cast<std::uint64_t>(i))));
    int cnt[L];
    const mask_t<V> defined = slq_lanczos(m, w.data(), steps, Q.data(), jets.data(), a.data(),
                                          b.data(), cnt);
    for (int l = 0; l < lanes; ++l) {
      const std::int64_t off = pairs[l] * steps;
      const int k = cnt[l];
      for (int j = 0; j < steps; ++j) {
        alpha[off + j] = lane(a[j], l);
        beta[off + j] = lane(b[j], l);
      }
      for (int j = 0; j < k; ++j) {
        d[j] = lane(a[j], l);
        e[j] = lane(b[j], l);
      }
      bool good = lane(defined, l) && gauss_quadrature(k, d.data(), e.data(), wt.data());
      for (int j = 0; j < steps; ++j) {
        nodes[off + j] = d[j < k ? j : k - 1];
        weights[off + j] = j < k ? wt[j] : Real(0);
      }
      count[pairs[l]] = k;
      if (!good) ok[rows[l]] = 0;  // every writer of row b stores 0: benign
    }
  });
}

}  // namespace pysharp::cpu
