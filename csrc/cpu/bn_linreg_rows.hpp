// BN linear regression's batched loss and gradient on the rows as they are.
//
// The generic driver (batched.hpp) transposes each block of L rows of W into lanes, runs the
// model on the block and transposes the gradient back. Here only W goes into lanes: there
// Z = W Xc^T (n values a row) and the BN part run exactly as in the model, and the gradient
// G = R Xc (B x d), a small GEMM, is written to the rows in place by a register-blocked
// kernel: L rows at a time, each multiply-add taking a row's r_i as a broadcast scalar and L
// consecutive columns of a zero-padded copy of Xc as a vector, so the transposition back
// (a third of the generic call at d 40, n 20) is gone. Every output is summed in the model's
// order, one multiply-add a term (z_i over k = 0 .. d-1, g_j over i = 0 .. n-1, as dense.hpp's
// matvec_rows and matvec_cols), and the rounding floor is the model's, so each row's loss,
// gradient and ok code are bit for bit the generic path's (tests/csrc/test_bn_linreg_rows.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
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

  // Whether it beats the lanes driver on B rows: on AVX-512, d padded by at most a quarter to
  // whole vectors, and B large enough to repay the padded copy of Xc. What it saves is the
  // lanes driver's transposition of the gradient back to rows, 8 x 8 tiles of 24 shuffles
  // on AVX-512; AVX2's 4 x 4 tiles cost a third as much a value, and there its 16 registers
  // leave the G blocks at 4 rows x 2 vectors. Measured against loss_grad_lanes, double, one
  // thread, B 4096: AVX-512 n 20 d 40 1.11-1.15x, n 33 d 40 1.12x, n 7 d 13 1.08x; B 1024
  // n 200 d 100 1.00-1.05x; n 33 d 9 (d pads from 9 to 16) 0.86x; AVX2 n 20 d 40 0.79x (0.84x
  // with 4 x 3 blocks, all 16 registers). Two threads, n 20 d 40: B 64 0.68x, B 512 1.0x,
  // B 4096 1.05x. Not measured on NEON (2 doubles a register): off there.
  static bool pays(const BNLinearRegression<Real>& m, std::int64_t B) {
    const int padding = (m.d + L - 1) / L * L - m.d;
    return kSimdBytes >= 64 && B >= 1024 && 4 * padding <= m.d;
  }

  explicit BNLinearRegressionRows(const BNLinearRegression<Real>& m)
      : m_(m), dp_((m.d + L - 1) / L * L), xc_(static_cast<std::size_t>(m.n) * dp_, Real(0)) {
    for (int i = 0; i < m.n; ++i)
      std::memcpy(xc_.data() + static_cast<std::size_t>(i) * dp_,
                  m.Xc + static_cast<std::size_t>(i) * m.d, m.d * sizeof(Real));
  }

  // Scratch per thread, in V: the block's rows in lanes (d), then Z in lanes (n).
  std::size_t scratch_size() const { return static_cast<std::size_t>(m_.d) + m_.n; }

  // Rows W[0 .. B) -> loss[0 .. B), G (B, d), ok codes: whole blocks of L rows here
  // (OpenMP over blocks when `parallel`), a last partial block through the lanes driver.
  void run(const Real* W, std::int64_t B, Real* loss, Real* G, std::uint8_t* ok,
           bool parallel) const {
    const std::int64_t d = m_.d, whole = B / L * L;
    if (whole > 0)
      for_each_block<L>(whole, parallel, [&] { return std::vector<V>(scratch_size()); },
                        [&](const std::int64_t* r, int, std::vector<V>& scratch) {
                          block(W + r[0] * d, loss + r[0], G + r[0] * d, ok + r[0],
                                scratch.data());
                        });
    if (whole < B)
      loss_grad_lanes(m_, W + whole * d, B - whole, loss + whole, G + whole * d, ok + whole);
  }

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
    // Z in blocks of at most kZBlock outputs, of equal size (n 20: 10 + 10, not 12 + 8).
    const int n = m_.n, parts = (n + kZBlock - 1) / kZBlock, size = (n + parts - 1) / parts;
    for (int i0 = 0; i0 < n; i0 += size)
      tail<kZBlock>(std::min(size, n - i0), [&](auto c) { products_z<decltype(c)::value>(w, i0, z); });
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

  // Outputs of Z a block: enough independent multiply-add chains to cover the latency of
  // two FMA ports (8), few enough to stay in registers with their operands.
  static constexpr int kZBlock = 12;

  // z[i0 .. i0 + NB) in lanes: z_i = sum_k w_k Xc[i, k], k ascending, Xc[i, k] a broadcast.
  template <int NB>
  void products_z(const V* w, int i0, V* z) const {
    const int d = m_.d;
    const Real* x = m_.Xc + static_cast<std::size_t>(i0) * d;
    vec acc[NB] = {};
    for (int k = 0; k < d; ++k) {
      const vec wk = w[k].v;
      PYSHARP_ROWS_UNROLL
      for (int b = 0; b < NB; ++b) acc[b] += wk * x[b * d + k];
    }
    PYSHARP_ROWS_UNROLL
    for (int b = 0; b < NB; ++b) z[i0 + b] = V(acc[b]);
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
  int dp_;                // d rounded up to whole vectors
  std::vector<Real> xc_;  // Xc (n, dp), zero-padded columns
};

// The batched loss and gradient of BN linear regression on the row kernel, whatever `pays`
// says (the test hook _core._bn_linreg_loss_grad_path calls it directly); bits as
// loss_grad_lanes.
template <class Real>
void loss_grad_rows(const BNLinearRegression<Real>& m, const Real* W, std::int64_t B,
                    Real* loss, Real* G, std::uint8_t* ok) {
  BNLinearRegressionRows<Real>(m).run(W, B, loss, G, ok, worth_threads(m, B));
}

// A model's batched loss and gradient, prepared for a batch of B rows and then run on the
// batch or on any of its row ranges: what the kernel needs beyond the model (BN linear
// regression's padded copy of Xc, where its row kernel pays) is built once, not once a
// range (the jax.ffi handlers run a batch in chunks, one thread each). Each range of whole
// lane blocks gives the bits of one call on the whole batch. Every model but BN linear
// regression runs the lanes driver (batched.hpp).
template <class Model, class Real>
class PreparedLossGrad {
 public:
  PreparedLossGrad(const Model& m, std::int64_t) : m_(m) {}
  void operator()(const Real* W, std::int64_t n, Real* loss, Real* G, std::uint8_t* ok) const {
    loss_grad_lanes(m_, W, n, loss, G, ok);
  }

 private:
  const Model& m_;
};

template <class Real>
class PreparedLossGrad<BNLinearRegression<Real>, Real> {
  using Rows = BNLinearRegressionRows<Real>;

 public:
  PreparedLossGrad(const BNLinearRegression<Real>& m, std::int64_t B) : m_(m) {
    if (Rows::pays(m, B)) rows_.emplace(m);
  }
  void operator()(const Real* W, std::int64_t n, Real* loss, Real* G, std::uint8_t* ok) const {
    if (rows_) rows_->run(W, n, loss, G, ok, worth_threads(m_, n));
    else loss_grad_lanes(m_, W, n, loss, G, ok);
  }

 private:
  const BNLinearRegression<Real>& m_;
  std::optional<Rows> rows_;
};

// Losses and gradients of B rows of W (B, D), OpenMP over the rows where they are worth it.
template <class Model, class Real>
void loss_grad(const Model& m, const Real* W, std::int64_t B, Real* loss, Real* G,
               std::uint8_t* ok) {
  PreparedLossGrad<Model, Real>(m, B)(W, B, loss, G, ok);
}

}  // namespace pysharp::cpu

#undef PYSHARP_ROWS_UNROLL
