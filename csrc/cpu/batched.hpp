// Batched CPU drivers: one model evaluation per row of a (B, D) array. Rows
// are gathered into lane blocks of W = kNativeLanes (core/lanes.hpp) and the
// model runs once per block in SIMD across rows; OpenMP splits the blocks.
// A row's arithmetic never involves another lane, so its result does not
// depend on B, its position or the thread count. ok[b] = 0 marks a row where
// the model is undefined, ok[b] = 2 a row outside the safe range (below).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pysharp/core/lanes.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp::cpu {

// Threads pay off only above some work: waking a team costs microseconds, and
// far more when the cores are busy. `rows` evaluations of a model. On 2 idle
// cores two threads already halve Toy3D's loss_grad at B = 512 (13.7 -> 7.6 us,
// 1536 units here); 2000 keeps the smallest calls on one thread.
template <class Model>
bool worth_threads(const Model& m, std::int64_t rows) {
  return rows > 1 && rows * static_cast<std::int64_t>(m.dim()) * (m.work_size() + 1) >= 2000;
}

// Squared norms in SafeNorm2's range (core/config.hpp) keep every kernel's intermediate
// values normal, so its unscaled result is exact to rounding. A row outside (a norm
// that over- or underflows, a zero w) is still computed but marked ok = 2:
// the Python layer (models/_base.py) rescales such rows by powers of two, which
// scale invariance makes exact, and calls again. Checking here, where the rows
// are in registers anyway, spares the common case a pass over W in NumPy that
// cost as much as a small model's kernel. Exported as _core.SAFE_NORM2.

// Per lane: lo < ||x||^2 < hi (false for NaN and inf). A gate far from the
// limits of the format, so its sum may take any order: four chains
// (dot_split) instead of one latency-bound chain of D multiply-adds.
template <class V>
mask_t<V> in_safe_range(const V* x, int D) {
  using Real = lane_real_t<V>;
  const V n2 = dot_split(x, x, D);
  return (n2 > V(SafeNorm2<Real>::lo)) & (n2 < V(SafeNorm2<Real>::hi));
}

// Per lane: x = 0 exactly (a zero direction v is exact at any scale).
template <class V>
mask_t<V> is_zero(const V* x, int D) {
  mask_t<V> zero = true;
  for (int i = 0; i < D; ++i) zero = zero & (x[i] == V(0));
  return zero;
}

// The ok code of lane l: 2 outside the safe range, else whether it is defined.
template <class M>
std::uint8_t ok_code(const M& safe, const M& defined, int l) {
  return !lane(safe, l) ? 2 : lane(defined, l) ? 1 : 0;
}

// Lane l of dst[0..D) takes row rows[l] of src (B, D); padding lanes
// (l >= lanes) repeat the first row.
template <class V, class Real>
void gather_rows(const Real* src, std::int64_t D, const std::int64_t* rows, int lanes, V* dst) {
  const Real* row[lane_width<V>];
  for (int l = 0; l < lane_width<V>; ++l) row[l] = src + rows[l < lanes ? l : 0] * D;
  gather_lanes(row, static_cast<int>(D), dst);
}

// Row rows[l] of dst (B, D) takes lane l of src[0..D), l < lanes.
template <class V, class Real>
void scatter_rows(const V* src, std::int64_t D, const std::int64_t* rows, int lanes, Real* dst) {
  if (lanes == lane_width<V>) {
    Real* row[lane_width<V>];
    for (int l = 0; l < lanes; ++l) row[l] = dst + rows[l] * D;
    scatter_lanes(src, static_cast<int>(D), row);
    return;
  }
  for (int l = 0; l < lanes; ++l)
    for (std::int64_t i = 0; i < D; ++i) dst[rows[l] * D + i] = lane(src[i], l);
}

// Iterations per chunk of a dynamic schedule over n iterations: about 64 chunks, so a
// thread that the OS deschedules (a busy machine) leaves its share to the others instead
// of holding up the call; a static split waits for its slowest thread. The schedule never
// changes a bit: each iteration writes its own rows.
inline std::int64_t dynamic_grain(std::int64_t n) { return std::max<std::int64_t>(1, n / 64); }

// Calls f(rows, lanes, scratch) for consecutive blocks of W row indices of
// [0, B), OpenMP over blocks when `parallel`; scratch = make() once per thread
// (a malloc per block would cost more than a small model's evaluation).
template <int W, class Make, class F>
void for_each_block(std::int64_t B, bool parallel, Make&& make, F&& f) {
  const std::int64_t blocks = (B + W - 1) / W, grain = dynamic_grain(blocks);
#pragma omp parallel if (parallel && blocks > 1)
  {
    auto scratch = make();
#pragma omp for schedule(dynamic, grain)
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      std::int64_t rows[W];
      const int lanes = static_cast<int>(std::min<std::int64_t>(W, B - blk * W));
      for (int l = 0; l < W; ++l) rows[l] = blk * W + (l < lanes ? l : 0);
      f(rows, lanes, scratch);
    }
  }
}

// Losses and gradients of B rows through lane blocks; loss_grad (bn_linreg_rows.hpp, included
// at the end) calls it for every model but BN linear regression.
template <class Model, class Real>
void loss_grad_lanes(const Model& m, const Real* W, std::int64_t B, Real* loss, Real* G,
                     std::uint8_t* ok) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim();
  auto make = [&] { return std::vector<V>(2 * D + m.work_size() + 1); };
  for_each_block<L>(B, worth_threads(m, B), make, [&](const std::int64_t* rows, int lanes,
                                                       std::vector<V>& buf) {
    V* w = buf.data();
    V* g = w + D;
    V* work = g + D;
    gather_rows(W, D, rows, lanes, w);
    const mask_t<V> safe = in_safe_range(w, D);
    V value;
    const mask_t<V> defined = m.loss_grad(w, &value, g, work);
    scatter_rows(g, D, rows, lanes, G);
    for (int l = 0; l < lanes; ++l) {
      loss[rows[l]] = lane(value, l);
      ok[rows[l]] = ok_code(safe, defined, l);
    }
  });
}

// Order 1: out = H v (HVP); order 2: out = D^3L[v, v].
template <int Order, class Model, class Real>
void directional(const Model& m, const Real* W, const Real* Vs, std::int64_t B, Real* out,
                 std::uint8_t* ok) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim();
  struct Buffers {
    std::vector<V> wvo;
    std::vector<Jet<V, Order>> jets;
  };
  auto make = [&] {
    return Buffers{std::vector<V>(3 * D), std::vector<Jet<V, Order>>(jet_scratch_size(m))};
  };
  for_each_block<L>(B, worth_threads(m, 3 * B), make, [&](const std::int64_t* rows, int lanes,
                                                           Buffers& buf) {
    V* w = buf.wvo.data();
    V* v = w + D;
    V* o = v + D;
    gather_rows(W, D, rows, lanes, w);
    gather_rows(Vs, D, rows, lanes, v);
    const mask_t<V> safe = in_safe_range(w, D) & (in_safe_range(v, D) | is_zero(v, D));
    mask_t<V> defined;
    if constexpr (Order == 1)
      defined = hvp(m, w, v, o, buf.jets.data());
    else
      defined = third_contraction(m, w, v, o, buf.jets.data());
    scatter_rows(o, D, rows, lanes, out);
    for (int l = 0; l < lanes; ++l) ok[rows[l]] = ok_code(safe, defined, l);
  });
}

// Dense Hessians (B, D, D), column j = H e_j. For small D only: D HVPs a row.
// The lanes of a block are consecutive (row, column) pairs, so a single row
// still fills the lanes and the threads.
template <class Model, class Real>
void hessian(const Model& m, const Real* W, std::int64_t B, Real* H, std::uint8_t* ok) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim();
  std::fill(ok, ok + B, std::uint8_t(1));
  struct Buffers {
    std::vector<V> wec;
    std::vector<Jet<V, 1>> jets;
  };
  auto make = [&] {
    return Buffers{std::vector<V>(3 * D), std::vector<Jet<V, 1>>(jet_scratch_size(m))};
  };
  for_each_block<L>(B * D, worth_threads(m, 3 * B * D), make, [&](const std::int64_t* pairs,
                                                                   int lanes, Buffers& buf) {
    V* w = buf.wec.data();
    V* e = w + D;
    V* col = e + D;
    std::int64_t rows[L];
    for (std::int64_t i = 0; i < D; ++i) e[i] = V(Real(0));
    for (int l = 0; l < L; ++l) {
      rows[l] = pairs[l] / D;
      set_lane(e[pairs[l] % D], l, Real(1));
    }
    gather_rows(W, D, rows, lanes, w);
    const mask_t<V> safe = in_safe_range(w, D);
    const mask_t<V> defined = hvp(m, w, e, col, buf.jets.data());
    for (int l = 0; l < lanes; ++l) {
      const std::int64_t b = rows[l], j = pairs[l] % D;
      Real* Hb = H + b * D * D;
      for (std::int64_t i = 0; i < D; ++i) Hb[i * D + j] = lane(col[i], l);
      // Every writer of row b sees the same w, hence stores the same code: benign.
      const std::uint8_t code = ok_code(safe, defined, l);
      if (code != 1) ok[b] = code;
    }
  });
}

}  // namespace pysharp::cpu

// loss_grad itself: the lanes driver above, or BN linear regression's row kernel.
#include "cpu/bn_linreg_rows.hpp"
