// BN linear regression's batched loss and gradient on the rows as they are.
//
// The generic driver (batched.hpp) transposes each block of L rows of W into lanes, runs the
// model on the block and transposes the gradient back: for this model the two transposes of
// D-long rows cost about a third of the call. Its two products are small GEMMs,
// Z = W Xc^T (B x n) and G = R Xc (B x d), which a register-blocked kernel runs on the rows
// in place: L rows at a time, each multiply-add taking a row's coordinate as a broadcast
// scalar and L consecutive columns of a zero-padded copy of Xc (or Xc^T) as a vector. Only
// Z (n long) goes through lanes, where the BN part runs exactly as in the model
// (bn_cosine_loss_grad). Every output is summed in the model's order, one multiply-add a
// term (z_i over k = 0 .. d-1, g_j over i = 0 .. n-1, as dense.hpp's matvec_rows and
// matvec_cols), and the rounding floor is the model's, so each row's loss, gradient and ok
// code are bit for bit the generic path's (tests/csrc/test_bn_linreg_rows.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/batched.hpp"
#include "pysharp/models/bn_linear_regression.hpp"

// The register blocks only stay in registers fully unrolled.
#define PYSHARP_ROWS_UNROLL _Pragma("GCC unroll 16")

namespace pysharp::cpu {

template <class Real>
class BNLinearRegressionRows {
 public:
  static constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  using vec = typename V::vec;
  // Column vectors per block: L x kVecs accumulators, kVecs operands and a broadcast fit
  // the registers (AVX-512 double: 24 + 3 + 1 of 32).
  static constexpr int kVecs = std::max(1, (kSimdRegisters - 4) / (L + 1));

  // Whether it beats the lanes driver on B rows: with 32 vector registers (AVX-512), n and d
  // padded by at most a quarter to whole vectors, and B large enough to repay the padded
  // copies of Xc (about 3 us). Measured against loss_grad_lanes, double, one thread: n 20
  // d 40 1.15-1.20x, n 200 d 100 1.04-1.08x, n 7 d 13 1.08x; n 33 d 9 (d pads from 9 to 16)
  // 0.86x; AVX2's 16 registers leave the blocks too small (0.80x at n 20 d 40). Two
  // threads, n 20 d 40: B 64 0.68x, B 512 1.02x, B 4096 1.16x.
  static bool pays(const BNLinearRegression<Real>& m, std::int64_t B) {
    const auto padding = [](int k) { return (k + L - 1) / L * L - k; };
    return kSimdRegisters >= 32 && B >= 1024 && 4 * padding(m.n) <= m.n &&
           4 * padding(m.d) <= m.d;
  }

  explicit BNLinearRegressionRows(const BNLinearRegression<Real>& m)
      : m_(m), np_((m.n + L - 1) / L * L), dp_((m.d + L - 1) / L * L),
        xct_(static_cast<std::size_t>(m.d) * np_, Real(0)),
        xc_(static_cast<std::size_t>(m.n) * dp_, Real(0)) {
    for (int i = 0; i < m.n; ++i)
      for (int k = 0; k < m.d; ++k) {
        xct_[static_cast<std::size_t>(k) * np_ + i] = m.Xc[static_cast<std::size_t>(i) * m.d + k];
        xc_[static_cast<std::size_t>(i) * dp_ + k] = m.Xc[static_cast<std::size_t>(i) * m.d + k];
      }
  }

  // Scratch per thread, in V: the block's gathered rows (d), then Z in lanes (np).
  std::size_t scratch_size() const { return static_cast<std::size_t>(m_.d) + np_; }

  // Rows W[0 .. L) (row-major, d each) -> loss[0 .. L), G[0 .. L) (d each), ok codes.
  void block(const Real* W, Real* loss, Real* G, std::uint8_t* ok, V* scratch) const {
    const int d = m_.d;
    V* w = scratch;
    V* z = scratch + d;
    // The rounding floor and the range gate need ||w||^2 in the model's order: in lanes.
    const Real* rows[L];
    for (int l = 0; l < L; ++l) rows[l] = W + static_cast<std::size_t>(l) * d;
    gather_lanes(rows, d, w);
    const mask_t<V> safe = in_safe_range(w, d);
    V w2 = Real(0);
    for (int j = 0; j < d; ++j) w2 += w[j] * w[j];
    for (int i0 = 0; i0 < np_; i0 += kVecs * L) {
      const int nv = std::min(kVecs, (np_ - i0) / L);
      if (nv == kVecs) products_z<kVecs>(W, i0, z);
      else tail<kVecs - 1>(nv, [&](auto c) { products_z<decltype(c)::value>(W, i0, z); });
    }
    V value;
    const mask_t<V> defined =
        bn_cosine_loss_grad(z, m_.u, m_.scale, m_.n, m_.rounding_floor2(w2), &value, z);
    const Real* r = reinterpret_cast<const Real*>(z);  // lane l of z[i] at r[i L + l]
    for (int j0 = 0; j0 < dp_; j0 += kVecs * L) {
      const int nv = std::min(kVecs, (dp_ - j0) / L);
      if (nv == kVecs) products_g<kVecs>(r, j0, G);
      else tail<kVecs - 1>(nv, [&](auto c) { products_g<decltype(c)::value>(r, j0, G); });
    }
    for (int l = 0; l < L; ++l) {
      loss[l] = lane(value, l);
      ok[l] = ok_code(safe, defined, l);
    }
  }

 private:
  // f(integral_constant<nv>) for a run-time nv in [1, N].
  template <int N, class F>
  static void tail(int nv, F&& f) {
    if constexpr (N >= 1) {
      if (nv == N) return f(std::integral_constant<int, N>{});
      tail<N - 1>(nv, f);
    }
  }

  static vec load(const Real* p) {
    vec x;
    std::memcpy(&x, p, sizeof(vec));
    return x;
  }

  // acc[l][v] = sum_{t < T} A[l lda + t sa] X[t ldx + v L .. + L), t ascending, one
  // multiply-add a term: L rows by NV vectors of a small GEMM.
  template <int NV>
  static void product(const Real* A, std::size_t lda, std::size_t sa, const Real* X,
                      std::size_t ldx, int T, vec (&acc)[L][NV]) {
    for (int t = 0; t < T; ++t) {
      vec x[NV];
      PYSHARP_ROWS_UNROLL
      for (int v = 0; v < NV; ++v) x[v] = load(X + t * ldx + v * L);
      PYSHARP_ROWS_UNROLL
      for (int l = 0; l < L; ++l) {
        const Real a = A[l * lda + t * sa];
        PYSHARP_ROWS_UNROLL
        for (int v = 0; v < NV; ++v) acc[l][v] += a * x[v];
      }
    }
  }

  // z[i0 .. i0 + NV L) in lanes: z_i = sum_k W[l, k] Xc[i, k], k ascending.
  template <int NV>
  void products_z(const Real* W, int i0, V* z) const {
    vec acc[L][NV] = {};
    product<NV>(W, m_.d, 1, xct_.data() + i0, np_, m_.d, acc);
    // acc[l][v] holds z_{i0 + v L + c} of row l at c: an L x L transpose per v.
    PYSHARP_ROWS_UNROLL
    for (int v = 0; v < NV; ++v) {
      const Real* cols[L];
      for (int l = 0; l < L; ++l) cols[l] = reinterpret_cast<const Real*>(&acc[l][v]);
      gather_lanes(cols, L, z + i0 + v * L);
    }
  }

  // G[l, j0 .. j0 + NV L) (the part below d): g_j = sum_i r_i Xc[i, j], i ascending; lane l
  // of z[i] is r_i of row l, at r[i L + l].
  template <int NV>
  void products_g(const Real* r, int j0, Real* G) const {
    const int d = m_.d;
    vec acc[L][NV] = {};
    product<NV>(r, 1, L, xc_.data() + j0, dp_, m_.n, acc);
    const int width = std::min(NV * L, d - j0);  // the padding columns are not stored
    for (int l = 0; l < L; ++l)
      std::memcpy(G + static_cast<std::size_t>(l) * d + j0, acc[l], width * sizeof(Real));
  }

  const BNLinearRegression<Real>& m_;
  int np_, dp_;            // n and d rounded up to whole vectors
  std::vector<Real> xct_;  // Xc^T (d, np), zero-padded columns
  std::vector<Real> xc_;   // Xc (n, dp), zero-padded columns
};

// The batched loss and gradient of BN linear regression: whole blocks of L rows on the rows,
// a last partial block through the generic driver; bits as loss_grad_lanes.
template <class Real>
void loss_grad_rows(const BNLinearRegression<Real>& m, const Real* W, std::int64_t B,
                    Real* loss, Real* G, std::uint8_t* ok) {
  using Rows = BNLinearRegressionRows<Real>;
  constexpr int L = Rows::L;
  const std::int64_t D = m.dim(), whole = Rows::pays(m, B) ? B / L * L : 0;
  if (whole > 0) {
    const Rows rows(m);
    auto make = [&] { return std::vector<typename Rows::V>(rows.scratch_size()); };
    for_each_block<L>(whole, worth_threads(m, whole), make,
                      [&](const std::int64_t* r, int, std::vector<typename Rows::V>& buf) {
                        rows.block(W + r[0] * D, loss + r[0], G + r[0] * D, ok + r[0],
                                   buf.data());
                      });
  }
  if (whole < B) loss_grad_lanes(m, W + whole * D, B - whole, loss + whole, G + whole * D,
                                 ok + whole);
}

// Losses and gradients of B rows of W (B, D): BN linear regression's row kernel, every
// other model the lanes driver (batched.hpp).
template <class Model, class Real>
void loss_grad(const Model& m, const Real* W, std::int64_t B, Real* loss, Real* G,
               std::uint8_t* ok) {
  if constexpr (std::is_same_v<Model, BNLinearRegression<Real>>)
    loss_grad_rows(m, W, B, loss, G, ok);
  else
    loss_grad_lanes(m, W, B, loss, G, ok);
}

}  // namespace pysharp::cpu

#undef PYSHARP_ROWS_UNROLL
