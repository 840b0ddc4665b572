// Mini-batch SGD on square-loss models and the linearised SGD of the
// stability theory (docs/theory.rst, section "SGD linear stability").
//
// Batches come from the counter-based RNG keyed by (seed, trajectory, step),
// so a trajectory's bits never depend on threads, chunking or backend.
// Nothing here allocates; drivers hand in scratch.
#pragma once

#include <cstdint>

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

// The stochastic gradient of batch idx (B indices), into g (dim()). Square-loss
// models: g = (1/B) sum_{i in I} grad l_i(w), always defined; work holds
// work_size() reals.
template <class Model, class Real>
PYSHARP_HD bool sgd_batch_grad(const Model& m, const Real* w, const int* idx, int B, Real* g,
                               Real* work) {
  const int D = m.dim(), d = m.input_dim();
  const Real coeff = Real(1) / Real(B);
  for (int k = 0; k < D; ++k) g[k] = Real(0);
  for (int j = 0; j < B; ++j)
    m.sample(w, m.X + static_cast<long long>(idx[j]) * d, m.y[idx[j]], coeff, g, work);
  return true;
}
// BN linear regression: ghost BN, grad L_I(w) with the batch's own statistics
// (BNLinearRegression::batch_loss_grad); false where they are undefined.
template <class Real>
PYSHARP_HD bool sgd_batch_grad(const BNLinearRegression<Real>& m, const Real* w, const int* idx,
                               int B, Real* g, Real* work) {
  Real loss;
  return m.batch_loss_grad(w, idx, B, &loss, g, work);
}

// Smallest batch the model's stochastic gradient is defined for, and the
// extra reals it needs for a batch of B.
template <class Model>
PYSHARP_HD int sgd_min_batch(const Model&) { return 1; }
template <class Real>
PYSHARP_HD int sgd_min_batch(const BNLinearRegression<Real>&) { return 2; }
template <class Model>
PYSHARP_HD long long sgd_batch_work(const Model&, int) { return 0; }
template <class Real>
PYSHARP_HD long long sgd_batch_work(const BNLinearRegression<Real>&, int B) {
  return 2 * static_cast<long long>(B);
}

// Scratch of one SGD trajectory with batches of at most max_batch: reals and ints.
template <class Model>
PYSHARP_HD long long sgd_scratch_reals(const Model& m, int max_batch) {
  return 2 * static_cast<long long>(m.dim()) + m.work_size() + sgd_batch_work(m, max_batch) + 1;
}
// perm (n) and the batch (max_batch, which exceeds n with replacement).
template <class Model>
PYSHARP_HD long long sgd_scratch_ints(const Model& m, int max_batch) {
  return static_cast<long long>(m.n_samples()) + max_batch;
}

// One SGD trajectory: w <- (1 - lr wd) w - lr g_t, g_t = sgd_batch_grad on
// batch I_t: for square-loss models (1/B) sum_{i in I_t} grad l_i(w),
// l_i = (f(x_i; w) - y_i)^2 / 2, so that the batch gradient is unbiased for
// grad L; for BN linear regression grad L_{I_t}(w) (ghost BN). A batch
// gradient that is undefined (ghost BN of a batch with X_I w constant) or an
// iterate that is not finite flags divergence, as does a full-batch loss that
// is undefined, not finite or above max_loss at a record.
// w holds the start and receives the final iterate (the last finite one if the
// trajectory diverged). loss: records at loss[r * stride]; later records of a
// diverged trajectory are NaN. Returns the step at which it diverged, or -1.
// scratch: sgd_scratch_reals(m, B) reals; iscratch: sgd_scratch_ints(m, B) ints.
template <class Model, class Real>
PYSHARP_HD long long run_sgd(const Model& m, const SGDConfig& c, std::uint64_t traj, Real* w,
                             Real lr, int B, Real wd, Real* loss, long long stride,
                             Real* scratch, int* iscratch) {
  const int D = m.dim(), n = m.n_samples();
  Real* g = scratch;
  Real* w_new = g + D;
  Real* work = w_new + D;
  int* perm = iscratch;
  int* idx = iscratch + n;
  for (int i = 0; i < n; ++i) perm[i] = i;
  const Real decay = Real(1) - lr * wd;
  const long long nrec = n_records(c.steps, c.record_every);
  long long diverged = -1;
  auto record = [&](long long t) {
    Real L;
    const bool defined = m.loss_grad(w, &L, g, work);
    if (!defined) L = Real(0) / Real(0);
    loss[(t / c.record_every) * stride] = L;
    return defined && is_finite(L) && L <= Real(c.max_loss);
  };
  if (!record(0)) diverged = 0;
  for (long long t = 0; t < c.steps && diverged < 0; ++t) {
    draw_batch(c.seed, traj, static_cast<std::uint64_t>(t), n, B, c.replacement, perm, idx);
    if (!sgd_batch_grad(m, w, idx, B, g, work)) {
      diverged = t + 1;
      break;
    }
    for (int k = 0; k < D; ++k) w_new[k] = decay * w[k] - lr * g[k];
    if (!all_finite(w_new, D)) {
      diverged = t + 1;
      break;
    }
    for (int k = 0; k < D; ++k) w[k] = w_new[k];
    if ((t + 1) % c.record_every == 0 && !record(t + 1)) diverged = t + 1;
  }
  if (diverged >= 0) {
    const long long first = diverged == 0 ? 1 : (diverged + c.record_every - 1) / c.record_every;
    for (long long r = first; r < nrec; ++r) loss[r * stride] = Real(0) / Real(0);
  }
  return diverged;
}

// Lane blocks (host; V = Lanes<Real, W>, core/lanes.hpp, or Real for W = 1).
// Square-loss models advance W trajectories in lockstep, lane-interleaved
// (w[k] holds coordinate k of every lane), each lane with its own batches
// (keyed by its own trajectory index, so the same whatever the block), lr, B,
// wd, divergence flag and records. Slot j of a step gathers sample idx_l[j] of
// every lane l into lane form (x, y, coefficient 1/B_l) and calls the model's
// sample() once for the block. A lane whose batch is shorter than the block's
// longest repeats its first sample with coefficient 0 in the extra slots: an
// exact no-op (its contribution is +-0, and g is never -0), or, where that
// sample overflows, a non-finite g the real slot already produced. So a lane's
// bits are those of run_sgd's arithmetic on its own, whatever its neighbours.

// Ghost BN (BNLinearRegression) runs trajectory by trajectory (run_sgd).
template <class Model>
inline constexpr bool kSgdOnLanes = true;
template <class Real>
inline constexpr bool kSgdOnLanes<BNLinearRegression<Real>> = false;

// Lane values and ints of one block's scratch (W lanes, batches of at most max_batch).
template <class Model>
long long sgd_lanes_scratch(const Model& m, int max_batch) {
  return 2 * static_cast<long long>(m.dim()) + m.work_size() +
         static_cast<long long>(max_batch + 1) * (m.input_dim() + 3);
}
template <class Model>
long long sgd_lanes_iscratch(const Model& m, int W, int max_batch) {
  return static_cast<long long>(W) * (m.n_samples() + max_batch);
}

// Lane form of W samples: lane l of x[k] = row[l][k], k < d (a transposition;
// cpu/sgd.hpp specialises it for AVX doubles).
template <class V>
void gather_samples(const lane_real_t<V>* const* row, int d, V* x) {
  for (int k = 0; k < d; ++k)
    for (int l = 0; l < lane_width<V>; ++l) set_lane(x[k], l, row[l][k]);
}

// g = sum_{j < B} coeff[j] r_j grad_w f(x_j), slots j of lane-form samples x
// (B, d), y, coeff: the model's sample() slot by slot.
template <class Model, class V>
void sgd_lanes_grad(const Model& m, const V* w, const V* x, const V* y, const V* coeff, int B,
                    V* g, V* work) {
  for (int k = 0; k < m.dim(); ++k) g[k] = V(lane_real_t<V>(0));
  for (int j = 0; j < B; ++j)
    m.sample(w, x + static_cast<long long>(j) * m.input_dim(), y[j], coeff[j], g, work);
}
// Linear regression: the same sums in the same order (the bits of sample()),
// but every residual first, two slots at a time (an odd B also computes slot
// B, which x, y, coeff hold and nothing reads), then each g[k] summed over
// the slots in a register: the dot products of different slots overlap, w[k]
// is loaded once per pair, g stored once instead of once per slot. Every slot
// takes the same instructions whatever B, so a lane's bits do not depend on
// its neighbours' batch sizes. work: B + 1 lane values (the c_j).
template <class Real, class V>
void sgd_lanes_grad(const LinearRegression<Real>& m, const V* w, const V* x, const V* y,
                    const V* coeff, int B, V* g, V* work) {
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
    c[j] = (((p[0] + p[1]) + (p[2] + p[3])) + b - y[j]) * coeff[j];
    c[j + 1] = (((q[0] + q[1]) + (q[2] + q[3])) + b - y[j + 1]) * coeff[j + 1];
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
}

// W = lane_width<V> trajectories of run_sgd in lockstep; lanes >= `lanes` are
// padding (never advanced in effect, never written back). traj, lr, batch, wd:
// W entries each (padding lanes may repeat lane 0). w (m.dim()) holds the
// starts and receives the finals (each lane's last finite iterate). loss[l]:
// lane l's records at loss[l][r * stride]; diverged[l]: run_sgd's return value.
// scratch: sgd_lanes_scratch(m, max_batch) lane values; iscratch:
// sgd_lanes_iscratch(m, W, max_batch) ints; max_batch >= every batch[l].
template <class Model, class V>
void run_sgd_lanes(const Model& m, const SGDConfig& c, int lanes, const std::uint64_t* traj,
                   V* w, const lane_real_t<V>* lr, const int* batch, const lane_real_t<V>* wd,
                   lane_real_t<V>* const* loss, long long stride, long long* diverged,
                   V* scratch, int* iscratch, int max_batch) {
  using Real = lane_real_t<V>;
  constexpr int W = lane_width<V>;
  const int D = m.dim(), n = m.n_samples(), d = m.input_dim();
  V* g = scratch;
  V* w_new = g + D;
  V* work = w_new + D;
  V* y = work + m.work_size() + max_batch + 1;
  V* coeff = y + max_batch + 1;
  V* x = coeff + max_batch + 1;
  int* perm[W];
  int* idx[W];
  V rate, decay;
  Real inv_batch[W];
  bool alive[W];
  for (int l = 0; l < W; ++l) {
    inv_batch[l] = Real(1) / Real(batch[l]);
    perm[l] = iscratch + static_cast<long long>(l) * (n + max_batch);
    idx[l] = perm[l] + n;
    for (int i = 0; i < n; ++i) perm[l][i] = i;
    for (int j = 0; j < max_batch; ++j) idx[l][j] = 0;
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
    int bmax = 0;
    for (int l = 0; l < lanes; ++l) {
      if (!alive[l]) continue;
      draw_batch(c.seed, traj[l], static_cast<std::uint64_t>(t), n, batch[l], c.replacement,
                 perm[l], idx[l]);
      bmax = batch[l] > bmax ? batch[l] : bmax;
    }
    for (int j = 0; j < bmax; ++j) {
      const Real* row[W];
      for (int l = 0; l < W; ++l) {
        const bool real = j < batch[l];
        const int i = idx[l][real ? j : 0];
        row[l] = m.X + static_cast<long long>(i) * d;
        set_lane(y[j], l, m.y[i]);
        set_lane(coeff[j], l, real ? inv_batch[l] : Real(0));
      }
      gather_samples(row, d, x + static_cast<long long>(j) * d);
    }
    sgd_lanes_grad(m, w, x, y, coeff, bmax, g, work);
    mask_t<V> finite(true);
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
