// Mini-batch SGD on square-loss models and the linearised SGD of the
// stability theory (docs/theory.rst, section "SGD linear stability").
//
// Batches come from the counter-based RNG keyed by (seed, trajectory, step),
// so a trajectory's bits never depend on threads, chunking or backend.
// Nothing here allocates; drivers hand in scratch.
#pragma once

#include <cstdint>

#include "pysharp/core/lanes.hpp"
#include "pysharp/engine/rng.hpp"
#include "pysharp/engine/trajectory.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/square_loss.hpp"

namespace pysharp {

// Random stream of the batch sampler: distinct from the jitter / Lanczos streams.
constexpr std::uint64_t kBatchStream = 0x5bd1e995ULL;

// Uniform integer in [0, m) from 64 random bits (53 used; bias < m 2^-53).
PYSHARP_HD inline int uniform_index(std::uint64_t bits, int m) {
  int k = static_cast<int>(uniform_open(bits) * m);
  return k < m ? k : m - 1;
}

// Batch `step` of trajectory `traj`: B indices into [0, n) written to idx.
// With replacement, B independent uniform draws. Without, a partial
// Fisher-Yates shuffle of perm (n entries, any permutation of 0..n-1 kept
// between calls): the first B entries are then a uniform B-subset whatever
// the permutation it started from.
PYSHARP_HD inline void draw_batch(std::uint64_t seed, std::uint64_t traj, std::uint64_t step,
                                  int n, int B, bool replacement, int* perm, int* idx) {
  for (int j = 0; j < B; ++j) {
    const std::uint64_t bits = hash4(seed ^ kBatchStream, traj, step, static_cast<std::uint64_t>(j));
    if (replacement) {
      idx[j] = uniform_index(bits, n);
    } else {
      const int r = j + uniform_index(bits, n - j);
      const int t = perm[j];
      perm[j] = perm[r];
      perm[r] = t;
      idx[j] = perm[j];
    }
  }
}

struct SGDConfig {
  long long steps = 0;
  long long record_every = 1;  // full-batch loss at t = 0, every, 2 every, ...
  bool replacement = false;
  std::uint64_t seed = 0;
  double max_loss = 1e100;     // a full-batch loss above this at a record flags divergence
};

// Smallest batch the model's stochastic gradient is defined for.
template <class Model>
int sgd_min_batch(const Model&) { return 1; }
template <class Real>
int sgd_min_batch(const BNLinearRegression<Real>&) { return 2; }

// Sample i's input row and target as the batch gradient reads them: (X, y) of
// a square-loss model; (Xc, u) of BN linear regression (bn_linear_regression.hpp).
template <class Model>
const auto* sample_row(const Model& m, int i) {
  return m.X + static_cast<long long>(i) * m.input_dim();
}
template <class Model>
auto sample_target(const Model& m, int i) { return m.y[i]; }
template <class Real>
const Real* sample_row(const BNLinearRegression<Real>& m, int i) {
  return m.Xc + static_cast<long long>(i) * m.d;
}
template <class Real>
Real sample_target(const BNLinearRegression<Real>& m, int i) { return m.u[i]; }

// SGD trajectories in lane blocks (host; V = Lanes<Real, W>, core/lanes.hpp,
// or Real for W = 1), lane-interleaved (w[k] holds coordinate k of every
// lane). Each lane has its own batches (keyed by its own trajectory index, so
// the same whatever the block), lr, wd, divergence flag and records; the
// lanes of a block share the batch size B. Step t: w <- (1 - lr wd) w - lr g_t
// with g_t the stochastic gradient of the lane's batch I_t:
//   square-loss models: (1/B) sum_{i in I_t} grad l_i(w),
//     l_i = (f(x_i; w) - y_i)^2 / 2, unbiased for grad L;
//   BN linear regression: grad L_{I_t}(w), ghost BN (statistics of the batch).
// A batch gradient that is undefined (ghost BN of a batch with X_I w
// constant), an iterate that is not finite, or a full-batch loss that is
// undefined, not finite or above max_loss at a record flags divergence.

// Lane values and ints of one block's scratch (W lanes, batches of B).
template <class Model>
long long sgd_lanes_scratch(const Model& m, int B) {
  return 2 * static_cast<long long>(m.dim()) + m.work_size() + 2 * static_cast<long long>(B) +
         static_cast<long long>(B + 1) * (m.input_dim() + 1);
}
template <class Model>
long long sgd_lanes_iscratch(const Model& m, int W, int B) {
  return static_cast<long long>(W) * (m.n_samples() + B);
}

// g = the batch gradient of slots j < B of lane-form samples x (B, d) and
// targets y (B), coeff = 1 / B. Square-loss models: sum_j coeff r_j grad_w
// f(x_j), the model's sample() slot by slot; always defined. work: the
// model's work_size() + 2 B + 1 lane values.
template <class Model, class V>
mask_t<V> sgd_lanes_grad(const Model& m, const V* w, const V* x, const V* y, const V& coeff,
                         int B, V* g, V* work) {
  for (int k = 0; k < m.dim(); ++k) g[k] = V(lane_real_t<V>(0));
  for (int j = 0; j < B; ++j)
    m.sample(w, x + static_cast<long long>(j) * m.input_dim(), y[j], coeff, g, work);
  return mask_t<V>(true);
}
// Linear regression: the same sums in the same order (the bits of sample()),
// but every residual first, two slots at a time (an odd B also computes slot
// B, which x and y hold and nothing reads), then each g[k] summed over the
// slots in a register: the dot products of different slots overlap, w[k] is
// loaded once per pair, g stored once instead of once per slot.
template <class Real, class V>
mask_t<V> sgd_lanes_grad(const LinearRegression<Real>& m, const V* w, const V* x, const V* y,
                         const V& coeff, int B, V* g, V* work) {
  const int d = m.d;
  V* c = work;
  const V b = m.bias ? w[d] : V(Real(0));
  for (int j = 0; j < B; j += 2) {  // dot_split of two slots at once: w[k] loaded once
    const V* x0 = x + static_cast<long long>(j) * d;
    const V* x1 = x0 + d;
    V p[4], q[4];
    for (int i = 0; i < 4; ++i) p[i] = q[i] = V(Real(0));
    int k = 0;
    for (; k + 4 <= d; k += 4)
      for (int i = 0; i < 4; ++i) {
        p[i] += w[k + i] * x0[k + i];
        q[i] += w[k + i] * x1[k + i];
      }
    for (; k < d; ++k) {
      p[0] += w[k] * x0[k];
      q[0] += w[k] * x1[k];
    }
    c[j] = (((p[0] + p[1]) + (p[2] + p[3])) + b - y[j]) * coeff;
    c[j + 1] = (((q[0] + q[1]) + (q[2] + q[3])) + b - y[j + 1]) * coeff;
  }
  constexpr int kB = 4;  // independent sums per pass (register blocking)
  int k = 0;
  for (; k + kB <= d; k += kB) {
    V acc[kB];
    for (int b = 0; b < kB; ++b) acc[b] = V(Real(0));
    for (int j = 0; j < B; ++j) {
      const V* xj = x + static_cast<long long>(j) * d + k;
      for (int b = 0; b < kB; ++b) acc[b] += c[j] * xj[b];
    }
    for (int b = 0; b < kB; ++b) g[k + b] = acc[b];
  }
  for (; k < d; ++k) {
    V acc = V(Real(0));
    for (int j = 0; j < B; ++j) acc += c[j] * x[static_cast<long long>(j) * d + k];
    g[k] = acc;
  }
  if (m.bias) {
    V acc = V(Real(0));
    for (int j = 0; j < B; ++j) acc += c[j];
    g[d] = acc;
  }
  return mask_t<V>(true);
}
// BN linear regression: ghost BN on each lane's batch; false in lanes where
// X_I w - mean_I is zero to working precision.
template <class Real, class V>
mask_t<V> sgd_lanes_grad(const BNLinearRegression<Real>& m, const V* w, const V* x,
                         const V* y, const V& /*coeff*/, int B, V* g, V* work) {
  V loss;
  return m.ghost_loss_grad(
      w, [&](int k) { return x + static_cast<long long>(k) * m.d; },
      [&](int k) { return y[k]; }, B, &loss, g, work);
}

// W = lane_width<V> SGD trajectories in lockstep, batches of B; lanes >=
// `lanes` are padding (never advanced in effect, never written back). traj,
// lr, wd: W entries each (padding lanes may repeat lane 0). w (m.dim()) holds
// the starts and receives the finals (each lane's last finite iterate).
// loss[l]: lane l's records at loss[l][r * stride], r = t / record_every
// (t = 0, record_every, ...); records after a divergence are NaN.
// diverged[l]: the step at which lane l diverged, or -1. scratch:
// sgd_lanes_scratch(m, B) lane values; iscratch: sgd_lanes_iscratch(m, W, B) ints.
template <class Model, class V>
void run_sgd_lanes(const Model& m, const SGDConfig& c, int lanes, const std::uint64_t* traj,
                   V* w, const lane_real_t<V>* lr, int B, const lane_real_t<V>* wd,
                   lane_real_t<V>* const* loss, long long stride, long long* diverged,
                   V* scratch, int* iscratch) {
  using Real = lane_real_t<V>;
  constexpr int W = lane_width<V>;
  const int D = m.dim(), n = m.n_samples(), d = m.input_dim();
  V* g = scratch;
  V* w_new = g + D;
  V* work = w_new + D;
  V* y = work + m.work_size() + 2 * B;
  V* x = y + B + 1;
  int* perm[W];
  int* idx[W];
  V rate, decay;
  const V coeff(Real(1) / Real(B));
  bool alive[W];
  for (int l = 0; l < W; ++l) {
    perm[l] = iscratch + static_cast<long long>(l) * (n + B);
    idx[l] = perm[l] + n;
    for (int i = 0; i < n; ++i) perm[l][i] = i;
    for (int j = 0; j < B; ++j) idx[l][j] = 0;
    set_lane(rate, l, lr[l]);
    set_lane(decay, l, Real(1) - lr[l] * wd[l]);
    alive[l] = l < lanes;
    if (l < lanes) diverged[l] = -1;
  }
  const long long nrec = n_records(c.steps, c.record_every);
  auto kill = [&](int l, long long t) {
    alive[l] = false;
    diverged[l] = t;
  };
  auto record = [&](long long t) {
    V L;
    const mask_t<V> defined = m.loss_grad(w, &L, g, work);
    const mask_t<V> ok = defined & is_finite(L) & (L <= V(Real(c.max_loss)));
    for (int l = 0; l < lanes; ++l) {
      if (!alive[l]) continue;
      loss[l][(t / c.record_every) * stride] = lane(defined, l) ? lane(L, l) : Real(0) / Real(0);
      if (!lane(ok, l)) kill(l, t);
    }
  };
  auto any_alive = [&] {
    for (int l = 0; l < lanes; ++l)
      if (alive[l]) return true;
    return false;
  };
  record(0);
  for (long long t = 0; t < c.steps && any_alive(); ++t) {
    for (int l = 0; l < lanes; ++l)
      if (alive[l])
        draw_batch(c.seed, traj[l], static_cast<std::uint64_t>(t), n, B, c.replacement,
                   perm[l], idx[l]);
    for (int j = 0; j < B; ++j) {
      const Real* row[W];
      for (int l = 0; l < W; ++l) {
        const int i = idx[l < lanes && alive[l] ? l : 0][j];  // dead lanes read any sample
        row[l] = sample_row(m, i);
        set_lane(y[j], l, sample_target(m, i));
      }
      gather_lanes(row, d, x + static_cast<long long>(j) * d);  // core/lanes.hpp
    }
    const mask_t<V> defined = sgd_lanes_grad(m, w, x, y, coeff, B, g, work);
    mask_t<V> finite = defined;
    for (int k = 0; k < D; ++k) {
      w_new[k] = decay * w[k] - rate * g[k];
      finite = finite & is_finite(w_new[k]);
    }
    mask_t<V> keep(false);
    for (int l = 0; l < lanes; ++l) {
      if (alive[l] && !lane(finite, l)) kill(l, t + 1);
      set_lane(keep, l, alive[l]);
    }
    for (int k = 0; k < D; ++k) w[k] = select(keep, w_new[k], w[k]);
    if ((t + 1) % c.record_every == 0) record(t + 1);
  }
  for (int l = 0; l < lanes; ++l) {
    const long long s = diverged[l];
    if (s < 0) continue;
    const long long first = s == 0 ? 1 : (s + c.record_every - 1) / c.record_every;
    for (long long r = first; r < nrec; ++r) loss[l][r * stride] = Real(0) / Real(0);
  }
}

// Linearised SGD at a minimum, x <- x - (lr/B) sum_{i in I_t} a_i (a_i . x),
// for steps t0 .. t0 + steps - 1 of run `run` (batches keyed by (seed, run, t)).
// A: (n, D) rows a_i. x (D) holds the state in and out, renormalised to unit
// norm every step so that growth and decay never over- or underflow; returns
// log(||x_end|| / ||x_start||) (-inf once x = 0 exactly; x is then left as is).
// scratch: D reals; iscratch: n + B ints (B may exceed n with replacement).
template <class Real>
PYSHARP_HD Real run_linear_sgd(const Real* A, int n, int D, Real lr, int B, bool replacement,
                               std::uint64_t seed, std::uint64_t run, long long t0,
                               long long steps, Real* x, Real* scratch, int* iscratch) {
  Real* y = scratch;
  int* perm = iscratch;
  int* idx = iscratch + n;
  for (int i = 0; i < n; ++i) perm[i] = i;
  Real nrm2 = Real(0);
  for (int k = 0; k < D; ++k) nrm2 += x[k] * x[k];
  if (!(nrm2 > Real(0))) return -Real(1) / Real(0);
  Real logg = -Real(0.5) * log(nrm2);
  Real inv = Real(1) / sqrt_(nrm2);
  for (int k = 0; k < D; ++k) x[k] *= inv;
  const Real c = lr / Real(B);
  for (long long t = t0; t < t0 + steps; ++t) {
    draw_batch(seed, run, static_cast<std::uint64_t>(t), n, B, replacement, perm, idx);
    for (int k = 0; k < D; ++k) y[k] = x[k];
    for (int j = 0; j < B; ++j) {
      const Real* a = A + static_cast<long long>(idx[j]) * D;
      Real s = Real(0);
      for (int k = 0; k < D; ++k) s += a[k] * x[k];
      s *= c;
      for (int k = 0; k < D; ++k) y[k] -= s * a[k];
    }
    nrm2 = Real(0);
    for (int k = 0; k < D; ++k) nrm2 += y[k] * y[k];
    if (!(nrm2 > Real(0))) return -Real(1) / Real(0);
    logg += Real(0.5) * log(nrm2);
    inv = Real(1) / sqrt_(nrm2);
    for (int k = 0; k < D; ++k) x[k] = y[k] * inv;
  }
  return logg;
}

}  // namespace pysharp
