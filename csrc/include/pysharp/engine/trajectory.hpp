// One optimisation trajectory on a scale-invariant model, start to finish:
// the update rule, metric recording, periodic spherical sharpness by Lanczos
// and divergence handling. Drivers (CPU OpenMP, CUDA) call run_trajectory
// once per trajectory; nothing here allocates.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/engine/lanczos.hpp"
#include "pysharp/engine/lanczos_lanes.hpp"
#include "pysharp/engine/methods.hpp"
#include "pysharp/engine/records.hpp"
#include "pysharp/engine/rng.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp {

// enum class Method and its properties: engine/methods.hpp, generated from the method table
// (pysharp/_engine/methods.py). Each method's branch of the update is below.

// Quasi-RMSprop (pgd_quasi_rmsprop): with g_t = grad L(theta_t) on the sphere,
//     1/eta_{t+1}^2 = b / eta_t^2 + c ||g_t||^2 + kappa c^2 ||g_t||^4 eta_t^2,
// b = rms_beta, kappa = qr_kappa (EngineConfig), c > 0 per trajectory (Hyperparameters::c;
// c = (1 - b) / lr^2 for a base LR lr), eta_0 per trajectory (Hyperparameters::eta).
// kappa = 0 is scalar RMSprop's scheduler; b = (1 - lr wd)^4, c = 2 b,
// kappa = 1 / (4 b) is GD+WD's (pgd_adaptive) exactly.

struct EngineConfig {
  Method method = Method::gd_wd;
  long long steps = 0;
  long long record_every = 1;
  long long sharpness_every = 0;  // 0: no sharpness tracking
  long long theta_every = 0;      // 0: no theta snapshots
  double jitter = 0.0;            // sigma: adds sigma ||w|| xi, xi ~ N(0, I/D)
  std::uint64_t seed = 0;
  double rms_beta = 0.99, rms_eps = 1e-12;
  double qr_kappa = 0.0;          // Quasi-RMSprop's fourth-order coefficient
  int top_k = 0;                  // >= 2: also record the top_k eigenvalues at sharpness steps
  LanczosOptions lanczos;         // k = 1; stream/counter set per call
};

// Where one trajectory's records go: a pointer per record of engine/records.hpp (generated
// from pysharp/_engine/records.py), named by its field. Element r of a record series is at
// field[(r * stride) * n], n its trailing size (1, D, groups or top_k), so arrays are
// (records, B, n); a record not asked for is null.
template <class Real>
struct TrajectoryRecords {
  long long stride;  // the batch size
#define PYSHARP_RECORD_FIELD(name, field, T, every, item, when) T* field;
  PYSHARP_RECORDS(PYSHARP_RECORD_FIELD)
#undef PYSHARP_RECORD_FIELD
  int groups;  // G = n_groups(model)
  int top_k;
};

// Record arrays of a whole batch, (records, B, n) each; each trajectory gets a strided view.
template <class Real>
struct BatchRecords {
#define PYSHARP_RECORD_FIELD(name, field, T, every, item, when) T* field = nullptr;
  PYSHARP_RECORDS(PYSHARP_RECORD_FIELD)
#undef PYSHARP_RECORD_FIELD
  int groups = 1;  // group_norm2 recorded only when G > 1
  int top_k = 0;   // top_eigs recorded only when k >= 2

  PYSHARP_HD TrajectoryRecords<Real> row(long long b, long long B, int D) const {
    TrajectoryRecords<Real> r;
    r.stride = B;
    r.groups = groups;
    r.top_k = top_k;
    const long long size[] = {1, D, groups, top_k};  // by RecordItem
#define PYSHARP_RECORD_ROW(name, field, T, every, item, when) \
  r.field = field ? field + b * size[static_cast<int>(RecordItem::item)] : nullptr;
    PYSHARP_RECORDS(PYSHARP_RECORD_ROW)
#undef PYSHARP_RECORD_ROW
    return r;
  }
};

PYSHARP_HD inline long long n_records(long long steps, long long every) {
  return every > 0 ? steps / every + 1 : 0;
}

// What a record holds at the rows a diverged trajectory never reached: NaN, or 0 for a flag.
template <class T, class Real>
PYSHARP_HD T unreached(Real nan) {
  if constexpr (std::is_same<T, Real>::value)
    return nan;
  else
    return T(0);
}

// Rows [first, last) of one trajectory's record series (element r at x[(r * stride) * n]).
template <class T>
PYSHARP_HD void fill_rows(T* x, long long first, long long last, long long stride,
                          long long n, T value) {
  for (long long r = first; r < last; ++r)
    for (long long k = 0; k < n; ++k) x[r * stride * n + k] = value;
}

template <class Real>
PYSHARP_HD bool all_finite(const Real* x, int n) {
  for (int i = 0; i < n; ++i)
    if (!(x[i] - x[i] == Real(0))) return false;  // NaN or inf
  return true;
}

// How the engine sees an iterate. FullSpaceState stores w itself; other
// states (bn_linreg_spectral.hpp) carry an exact reduced representation.
// V is Real (one trajectory) or a lane block of W trajectories (core/lanes.hpp),
// stored lane-interleaved: w[i] holds coordinate i of every lane.
// A state provides, with M = mask_t<V>:
//   M evaluate(V& loss, V& norm2, V& gnorm2, V& s, bool read)  L, ||s w||^2,
//       ||grad L(s w)||^2 and the power of two s it evaluated at: 1 where ||w||^2 is in
//       SafeNorm2's range, else the s that brings w to order one (unit_scale), exact by
//       scale invariance, so a norm of 1e200 or 1e-200 gives the loss and sharpness of
//       w / ||w||. read: whether the norms' values reach a record or the update, which
//       then need their bits; otherwise they only decide (range, finiteness)
//   void scale_point(V f)                               w *= f (a power of two per lane)
//   const V* point()                                    w (length D)
//   Real grad_dot(int l, const Real* v)                 v . grad L(w) of lane l
//   M advance(M live, bool sphere, V decay, V step, V norm, V jitter_amp,
//             std::uint64_t seed, const long long* traj, long long t)
//       w+ = decay w - step grad L(w) + noise, or on the sphere
//       w+ = Pi(w / norm - step grad L(w) + noise); false in a lane where w+ is
//       not finite. Lanes that are live and finite move; the others keep w.
// s, per lane: 1 where norm2 = ||w||^2 is in SafeNorm2's range (core/config.hpp), else the
// power of two that brings w's largest |w_i| into [1/2, 1) (within 2^+-1022, float
// 2^+-126, so that it and its inverse are normal); 1 for a zero or non-finite w, which the
// checks after the evaluation flag. Returns whether any lane's s is not 1.
template <class V>
PYSHARP_HD bool unit_scale(const V* w, int D, const V& norm2, V& s) {
  using Real = lane_real_t<V>;
  const mask_t<V> safe = (norm2 > V(SafeNorm2<Real>::lo)) & (norm2 < V(SafeNorm2<Real>::hi));
  s = V(Real(1));
  if (!any(!safe)) return false;
  bool scaled = false;
  for (int l = 0; l < lane_width<V>; ++l) {
    if (lane(safe, l)) continue;
    Real peak = Real(0);
    for (int i = 0; i < D; ++i) {
      const Real a = lane(w[i], l);
      peak = a > peak ? a : -a > peak ? -a : peak;
    }
    if (!(peak > Real(0)) || !is_finite(peak)) continue;
    const Real cap = static_cast<Real>(ldexp(1.0, sizeof(Real) == 8 ? 1022 : 126));
    const Real f = inverse_binade(peak);
    set_lane(s, l, f > cap ? cap : f < Real(1) / cap ? Real(1) / cap : f);
    scaled = true;
  }
  return scaled;
}

template <class Model, class V>
struct FullSpaceState {
  using Real = lane_real_t<V>;
  const Model& m;
  V* w;
  V* g;  // gradient, then the next iterate
  V* work;

  // Scratch: scratch_size(model) V.
  PYSHARP_HD FullSpaceState(const Model& model, const V* w0, V* scratch)
      : m(model), w(scratch), g(scratch + model.dim()), work(scratch + 2 * model.dim()) {
    for (int i = 0; i < m.dim(); ++i) w[i] = w0[i];
  }
  PYSHARP_HD static long long scratch_size(const Model& model) {
    return 2LL * model.dim() + model.work_size() + 1;
  }
  PYSHARP_HD mask_t<V> evaluate(V& loss, V& norm2, V& gnorm2, V& s, bool read) {
    const int D = m.dim();
    mask_t<V> ok = m.loss_grad(w, &loss, g, work);
    if (read)
      norms(norm2, gnorm2);
    else
      norms_unordered(norm2, gnorm2);
    // The common case ends here: the check comes after the evaluation, off the step's
    // dependency chain. Outside the safe range the block is evaluated again at s w, in
    // place: exact both ways, but for components below 2^-1022 of the largest, which a
    // huge w's rescaling rounds (lanes with s = 1 get their bits again).
    if (!unit_scale(w, D, norm2, s)) return ok;
    scale_point(s);
    ok = m.loss_grad(w, &loss, g, work);
    norms(norm2, gnorm2);
    scale_point(Real(1) / s);
    for (int i = 0; i < D; ++i) g[i] *= s;  // grad L(w) = s grad L(s w)
    return ok;
  }
  // ||w||^2 and ||g||^2, each summed in index order (lane_dot's order, so its bits), in one
  // loop: two dependency chains of D multiply-adds in flight at once instead of one after
  // the other (BN matrix completion D 800: 1.10x on AVX2, 1.05x on AVX-512).
  PYSHARP_HD void norms(V& norm2, V& gnorm2) const {
    V a = V(Real(0)), b = V(Real(0));
    for (int i = 0; i < m.dim(); ++i) {
      a += w[i] * w[i];
      b += g[i] * g[i];
    }
    norm2 = a;
    gnorm2 = b;
  }
  // The same norms for a step that only tests them (range, finiteness), as two partial sums
  // each: four chains in flight halve the latency of the step's longest reductions (BN
  // linreg d 40, AVX2 on a Zen 4 EPYC: 1.07x).
  PYSHARP_HD void norms_unordered(V& norm2, V& gnorm2) const {
    const int D = m.dim();
    V a0 = V(Real(0)), a1 = V(Real(0)), b0 = V(Real(0)), b1 = V(Real(0));
    int i = 0;
    for (; i + 2 <= D; i += 2) {
      a0 += w[i] * w[i];
      b0 += g[i] * g[i];
      a1 += w[i + 1] * w[i + 1];
      b1 += g[i + 1] * g[i + 1];
    }
    if (i < D) {
      a0 += w[i] * w[i];
      b0 += g[i] * g[i];
    }
    norm2 = a0 + a1;
    gnorm2 = b0 + b1;
  }
  PYSHARP_HD void scale_point(const V& f) {
    for (int i = 0; i < m.dim(); ++i) w[i] *= f;
  }
  PYSHARP_HD const V* point() const { return w; }
  PYSHARP_HD Real grad_dot(int l, const Real* v) const {
    Real s = Real(0);
    for (int i = 0; i < m.dim(); ++i) s += v[i] * lane(g[i], l);
    return s;
  }
  PYSHARP_HD mask_t<V> advance(const mask_t<V>& live, bool sphere, const V& decay,
                               const V& step, const V& norm, const V& jitter_amp,
                               std::uint64_t seed, const long long* traj, long long t) {
    const int D = m.dim();
    if (sphere)
      for (int i = 0; i < D; ++i) g[i] = w[i] / norm - step * g[i];
    else
      for (int i = 0; i < D; ++i) g[i] = decay * w[i] - step * g[i];
    if (any(jitter_amp > V(0)))
      for (int i = 0; i < D; ++i) {
        V xi;
        for (int l = 0; l < lane_width<V>; ++l)
          set_lane(xi, l, static_cast<Real>(normal(seed, static_cast<std::uint64_t>(traj[l]),
                                                   static_cast<std::uint64_t>(t), i)));
        g[i] += jitter_amp * xi;
      }
    if (sphere) {
      const V n_next = sqrt_(lane_dot(g, g, D));
      for (int i = 0; i < D; ++i) g[i] /= n_next;
    }
    mask_t<V> finite = true;
    for (int i = 0; i < D; ++i) finite = finite & is_finite(g[i]);
    const mask_t<V> move = finite & live;
    for (int i = 0; i < D; ++i) w[i] = select(move, g[i], w[i]);
    return finite;
  }
};

// The options of the in-run top-k solve (top_k >= 2): the sharpness options with k.
PYSHARP_HD inline LanczosOptions top_k_options(const EngineConfig& c) {
  LanczosOptions o = c.lanczos;
  o.k = c.top_k;
  return o;
}

// Reals of the scalar k = 1 Lanczos and its two outputs: a W = 1 runner's sharpness
// solve. A lane runner (W > 1) runs the lockstep solve instead and needs none.
PYSHARP_HD inline long long scalar_sharpness_reals(int D, const EngineConfig& c, int W) {
  return W == 1 ? lanczos_scratch_size(D, c.lanczos) + 2 : 0;
}

// Scratch (Reals) of a runner of W lanes besides the state's own: each lane's
// v1, the new eigenvector, a lane's point, the scalar sharpness solve (W = 1);
// for top_k >= 2 the top-k solve's scratch, eigenvalues, eigenvectors and
// residuals; for W > 1 also the lockstep Lanczos' Reals and its W eigenvectors.
PYSHARP_HD inline long long trajectory_scratch_reals(int D, const EngineConfig& c, int W = 1) {
  const long long lanes =
      W > 1 ? lanczos_lanes_scratch_reals(D, c.lanczos.max_iter, W) + W * (D + 2LL) : 0;
  const long long top =
      c.top_k >= 2 ? lanczos_scratch_size(D, top_k_options(c)) + c.top_k * (D + 2LL) : 0;
  return (W + 2LL) * D + scalar_sharpness_reals(D, c, W) + lanes + top;
}
// Lane values (V) a runner of W > 1 lanes needs for lockstep Lanczos: the
// recurrence's own and the block of warm starts.
PYSHARP_HD inline long long trajectory_scratch_lanes(int D, const EngineConfig& c) {
  return lanczos_lanes_scratch_v(D, c.lanczos.max_iter) + D;
}

// W trajectories (one lane each; W = 1 for a plain Real) as a sequence of
// observe(t) (measure and record step t) and step(t) (apply the update of
// step t) calls. m supplies the HVPs of Lanczos at each lane's point.
// traj[l]: lane l's global trajectory index (keys its random streams, so a
// batch split into chunks gives the same bits when each chunk passes its
// offset). Lanes >= `lanes` are padding: computed, never recorded or flagged.
// A lane's arithmetic never involves another lane, so its bits do not depend
// on its position. h: lane l's hyperparameters at index l (the fields its method
// reads, methods.hpp). scratch: trajectory_scratch_reals(D, c, W) Reals; jets:
// jet_scratch_size(m) order-1 jets (Lanczos runs lane by lane, in Real).
template <class Model, class State, class V>
class TrajectoryRunner {
 public:
  using Real = lane_real_t<V>;
  using Mask = mask_t<V>;
  static constexpr int W = lane_width<V>;

  PYSHARP_HD TrajectoryRunner(const Model& m, const EngineConfig& c, int lanes,
                              const long long* traj, State& state,
                              const Hyperparameters<Real>& h,
                              const TrajectoryRecords<Real>* out, Real* scratch,
                              Jet<Real, 1>* jets, V* lane_scratch = nullptr,
                              Jet<V, 1>* lane_jets = nullptr)
      : m_(m), c_(c), lanes_(lanes), state_(state), v_new_(scratch + W * m.dim()),
        w_lane_(v_new_ + m.dim()), lz_(w_lane_ + m.dim()), jets_(jets),
        lane_scratch_(lane_scratch), lane_jets_(lane_jets) {
    if (W == 1) {
      lz_eval_ = lz_ + lanczos_scratch_size(m.dim(), c.lanczos);
      lz_resid_ = lz_eval_ + 1;
    }
    lz_top_ = lz_ + scalar_sharpness_reals(m.dim(), c, W);
    lz_lanes_ = lz_top_ + (c.top_k >= 2 ? lanczos_scratch_size(m.dim(), top_k_options(c)) +
                                              c.top_k * (m.dim() + 2LL)
                                        : 0);
    on_sphere_ = method_on_sphere(c.method);
    for (int l = 0; l < W; ++l) {
      const int src = l < lanes ? l : 0;  // padding repeats lane 0
      traj_[l] = traj[src];
      // The step size: GD+WD's lr off the sphere, the effective LR (or eta_0) on it.
      set_lane(lr_, l, on_sphere_ ? h.eta[src] : h.lr[src]);
      // GD+WD's decay factor 1 - lr wd, which pgd_adaptive's eta recursion also follows.
      set_lane(decay_, l, h.wd ? Real(1) - h.lr[src] * h.wd[src] : Real(1));
      set_lane(qr_c_, l, h.c ? h.c[src] : Real(0));
      v1_[l] = scratch + l * m.dim();
      have_v1_[l] = false;
      alive_[l] = l < lanes;
      set_lane(live_, l, alive_[l]);
      rec_[l] = sh_[l] = th_[l] = 0;
      if (l < lanes) {
        out_[l] = out[l];
        *out_[l].diverged = 0;
        *out_[l].diverged_step = -1;
      }
    }
    eta_ = lr_;
    if (c.sharpness_every <= 0) next_sh_ = -1;
    if (c.theta_every <= 0) next_th_ = -1;
  }

  // One trajectory (W = 1).
  PYSHARP_HD TrajectoryRunner(const Model& m, const EngineConfig& c, long long traj,
                              State& state, const Hyperparameters<Real>& h,
                              const TrajectoryRecords<Real>& out, Real* scratch,
                              Jet<Real, 1>* jets)
      : TrajectoryRunner(m, c, 1, &traj, state, h, &out, scratch, jets) {
    static_assert(W == 1, "one trajectory per runner");
  }

  PYSHARP_HD bool diverged(int l = 0) const { return *out_[l].diverged != 0; }

  // Marks lane l diverged at step t (its state is kept as it is).
  PYSHARP_HD void flag(int l, long long t) {
    *out_[l].diverged = 1;
    *out_[l].diverged_step = t;
    alive_[l] = false;
    set_lane(live_, l, false);
  }
  PYSHARP_HD void flag(long long t) { flag(0, t); }

  // False once no lane is left running.
  PYSHARP_HD bool observe(long long t) {
    const int D = m_.dim();
    // norm2_, gnorm2_ and norm_ are those of the scaled point scale_ w (scale_ = 1 but at
    // extreme norms), the records' ||w||^2 and the effective LR those of w itself.
    // Plain GD+WD reads the norms at events only; between them they just decide. A tiny
    // model keeps the one loop: its dim() is a constant, and the test folds away (a test in
    // its step cost Toy3D 5 %).
    const bool read = m_.dim() < 16 || c_.method != Method::gd_wd || c_.jitter > 0 ||
                      t == next_sh_ || t == next_rec_ || t == next_th_;
    const Mask evaluated = state_.evaluate(loss_, norm2_, gnorm2_, scale_, read);  // before the checks
    const Mask defined = evaluated & is_finite(loss_) & is_finite(gnorm2_) & is_finite(norm2_);
    if (any(live_ & !defined))
      for (int l = 0; l < lanes_; ++l)
        if (alive_[l] && !lane(defined, l)) flag(l, t);
    if (!any(live_)) return false;
    if (c_.method == Method::scalar_rmsprop)
      rms_v_ = Real(c_.rms_beta) * rms_v_ + Real(1 - c_.rms_beta) * (gnorm2_ * scale_ * scale_);
    // Events come from counters, not t % every: an integer division per step
    // costs as much as a small model's whole update.
    const bool sharp = t == next_sh_, record = t == next_rec_, snapshot = t == next_th_;
    if (sharp) next_sh_ += c_.sharpness_every;
    if (record) next_rec_ += c_.record_every;
    if (snapshot) next_th_ += c_.theta_every;
    const bool event = sharp || record || snapshot;
    if (event || on_sphere_ || c_.jitter > 0) norm_ = sqrt_(norm2_);
    if (!event) return true;
    // Effective LR of this step on the sphere: theta+ = Pi(theta - eff grad L(theta)).
    const V norm2_w = norm2_ / scale_ / scale_;  // ||w||^2 (inf or 0 beyond the format)
    if (on_sphere_)
      eff_ = eta_;
    else if (c_.method == Method::scalar_rmsprop)
      eff_ = lr_ / ((sqrt_(rms_v_) + Real(c_.rms_eps)) * decay_ * norm2_w);
    else
      eff_ = lr_ / (decay_ * norm2_w);
    // The solves, records and snapshots below see the scaled point, restored at the end.
    const bool rescaled = any(!(scale_ == V(Real(1))));
    if (rescaled) state_.scale_point(scale_);
    // Lane blocks: one lockstep Lanczos for every lane (lanczos_lanes.hpp).
    Real* block_evecs = nullptr;
    Real* block_eval = nullptr;
    LanczosReport block_rep[W];
    if constexpr (W > 1) {
      if (sharp) {
        const int m_max = c_.lanczos.max_iter;
        Real* rs = lz_lanes_;
        block_evecs = rs + lanczos_lanes_scratch_reals(D, m_max, W);
        block_eval = block_evecs + static_cast<long long>(W) * D;
        Real* block_resid = block_eval + W;
        V* start = lane_scratch_ + lanczos_lanes_scratch_v(D, m_max);
        std::uint64_t stream[W];
        bool warm[W];
        for (int l = 0; l < W; ++l) {
          stream[l] = static_cast<std::uint64_t>(traj_[l]);
          warm[l] = have_v1_[l];
          for (int i = 0; i < D; ++i) set_lane(start[i], l, have_v1_[l] ? v1_[l][i] : Real(0));
        }
        LanczosOptions lo = c_.lanczos;
        lo.k = 1;
        lo.counter = static_cast<std::uint64_t>(t);
        const V* w = state_.point();
        Jet<V, 1>* jets = lane_jets_;
        const Model& m = m_;
        auto apply = [&](const V* x, V* y) { return hvp(m, w, x, y, jets); };
        lanczos_lanes(apply, D, lo, stream, start, warm, block_eval, block_evecs, block_resid,
                      block_rep, lane_scratch_, rs);
      }
    }
    for (int l = 0; l < lanes_; ++l) {
      if (!alive_[l]) continue;
      const long long S = out_[l].stride;
      const Real norm = lane(norm_, l), norm2 = lane(norm2_, l), eff = lane(eff_, l);
      const Real s = lane(scale_, l);
      const Real* w = point(l);
      if (sharp) {
        Real eval;
        const Real* evec;
        LanczosReport rep;
        if constexpr (W > 1) {  // computed for the whole block above
          eval = block_eval[l];
          evec = block_evecs + static_cast<long long>(l) * D;
          rep = block_rep[l];
        } else {
          LanczosOptions lo = c_.lanczos;
          lo.k = 1;
          lo.stream = static_cast<std::uint64_t>(traj_[l]);
          lo.counter = static_cast<std::uint64_t>(t);
          Jet<Real, 1>* jets = jets_;
          const Model& m = m_;
          auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets); };
          rep = lanczos(apply, D, lo, have_v1_[l] ? v1_[l] : nullptr, lz_eval_, v_new_,
                        lz_resid_, lz_);
          eval = *lz_eval_;
          evec = v_new_;
        }
        if (!rep.ok || !is_finite(eval)) {
          flag(l, t);
          continue;
        }
        // Keep the eigenvector's sign continuous so top_grad shows the oscillation.
        const Real flip =
            (have_v1_[l] && lane_dot(evec, v1_[l], D) < Real(0)) ? Real(-1) : Real(1);
        for (int i = 0; i < D; ++i) v1_[l][i] = flip * evec[i];
        have_v1_[l] = true;
        const Real sharpness = eval * norm2;  // S(w) = ||w||^2 lambda_1(H(w))
        out_[l].sharpness[sh_[l] * S] = sharpness;
        out_[l].eos_ratio[sh_[l] * S] = eff * sharpness;
        out_[l].sharpness_converged[sh_[l] * S] = rep.converged;
        if (out_[l].top_eigs) record_top_k(l, t, w, norm2, out_[l].top_eigs + sh_[l] * S * c_.top_k);
        ++sh_[l];
      }
      if (record) {
        const long long r = rec_[l]++;
        out_[l].loss[r * S] = lane(loss_, l);
        out_[l].norm2[r * S] = lane(norm2_w, l);
        out_[l].eff_lr[r * S] = eff;
        // ||grad L(theta)|| = ||w|| ||grad L(w)||, the same at s w
        out_[l].grad_norm[r * S] = norm * sqrt_(lane(gnorm2_, l));
        if (out_[l].top_grad)  // the state's gradient is grad L(w) = s grad L(s w)
          out_[l].top_grad[r * S] =
              have_v1_[l] ? norm * (state_.grad_dot(l, v1_[l]) / s) : Real(0) / Real(0);
        if (out_[l].group_norm2) {
          const int G = out_[l].groups;
          Real* dst = out_[l].group_norm2 + r * S * G;
          for (int k = 0, b = 0; k < G; ++k) {
            const int e = group_begin(m_, k + 1);
            dst[k] = lane_dot(w + b, w + b, e - b) / s / s;
            b = e;
          }
        }
      }
      if (snapshot) {
        Real* dst = out_[l].theta + th_[l]++ * S * D;
        for (int i = 0; i < D; ++i) dst[i] = w[i] / norm;
      }
    }
    if (rescaled) state_.scale_point(Real(1) / scale_);
    return any(live_);
  }

  // The top_k eigenvalues of H at lane l's point w, spherical (times ||w||^2), into dst:
  // a separate locking solve (lanczos.hpp) from a random start keyed by (trajectory,
  // step), so the k = 1 sharpness and every other record are those of a run without it.
  // NaN where the solve fails.
  PYSHARP_HD void record_top_k(int l, long long t, const Real* w, Real norm2, Real* dst) {
    const int D = m_.dim(), k = c_.top_k;
    LanczosOptions lo = top_k_options(c_);
    lo.stream = static_cast<std::uint64_t>(traj_[l]);
    lo.counter = static_cast<std::uint64_t>(t);
    Real* evals = lz_top_ + lanczos_scratch_size(D, lo);
    Real* resid = evals + k;
    Real* evecs = resid + k;
    Jet<Real, 1>* jets = jets_;
    const Model& m = m_;
    auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets); };
    const LanczosReport rep =
        lanczos(apply, D, lo, static_cast<const Real*>(nullptr), evals, evecs, resid, lz_top_);
    for (int j = 0; j < k; ++j) dst[j] = rep.ok ? evals[j] * norm2 : Real(0) / Real(0);
  }

  // The update of step t, after observe(t).
  PYSHARP_HD bool step(long long t) {
    // ||w||, where the update reads it (the sphere, jitter): plain GD+WD's step needs no
    // division more than its update's own.
    const V norm_w = on_sphere_ || c_.jitter > 0 ? norm_ / scale_ : norm_;
    V step;  // the coefficient of grad L(w) in the update
    if (on_sphere_)
      step = eta_ * norm_w;  // theta - eta grad L(theta), grad L(theta) = ||w|| grad L(w)
    else if (c_.method == Method::scalar_rmsprop)
      step = lr_ / (sqrt_(rms_v_) + Real(c_.rms_eps));
    else
      step = lr_;
    const V amp =
        c_.jitter > 0 ? Real(c_.jitter) * norm_w / sqrt_(Real(m_.dim())) : V(Real(0));
    const Mask finite =
        state_.advance(live_, on_sphere_, decay_, step, norm_w, amp, c_.seed, traj_, t);
    if (any(live_ & !finite))
      for (int l = 0; l < lanes_; ++l)
        if (alive_[l] && !lane(finite, l)) flag(l, t + 1);
    if (c_.method == Method::pgd_adaptive)  // 1/eta+ = (1 - lr wd)^2 (1/eta + eta ||grad L(theta)||^2)
      eta_ = Real(1) / (decay_ * decay_ * (Real(1) / eta_ + eta_ * norm2_ * gnorm2_));
    if (c_.method == Method::pgd_quasi_rmsprop) {  // the scheduler above
      const V g2 = norm2_ * gnorm2_;                // ||grad L(theta)||^2
      const V cg2 = qr_c_ * g2;
      eta_ = Real(1) / sqrt_(Real(c_.rms_beta) / (eta_ * eta_) + cg2 +
                             Real(c_.qr_kappa) * cg2 * cg2 * eta_ * eta_);
    }
    return any(live_);
  }

  // A diverged trajectory is frozen: its last finite iterate is kept and the
  // records it never reached are NaN (flags 0).
  PYSHARP_HD void finish() {
    const int D = m_.dim();
    const Real nan = Real(0) / Real(0);
    const long long nrec = n_records(c_.steps, c_.record_every);
    const long long nsh = n_records(c_.steps, c_.sharpness_every);
    const long long nth = n_records(c_.steps, c_.theta_every);
    const long long rows[] = {0, nrec, nsh, nth};  // by RecordEvery
    for (int l = 0; l < lanes_; ++l) {
      const TrajectoryRecords<Real>& o = out_[l];
      const long long S = o.stride;
      const long long reached[] = {0, rec_[l], sh_[l], th_[l]};  // by RecordEvery
      const long long size[] = {1, D, o.groups, o.top_k};         // by RecordItem
#define PYSHARP_RECORD_UNREACHED(name, field, T, every, item, when)                \
  if (RecordEvery::every != RecordEvery::none && o.field)                          \
    fill_rows(o.field, reached[static_cast<int>(RecordEvery::every)],              \
              rows[static_cast<int>(RecordEvery::every)], S,                       \
              size[static_cast<int>(RecordItem::item)], unreached<T>(nan));
      PYSHARP_RECORDS(PYSHARP_RECORD_UNREACHED)
#undef PYSHARP_RECORD_UNREACHED
      const Real* w = point(l);
      for (int i = 0; i < D; ++i) o.w_final[i] = w[i];
    }
  }

 private:
  // Lane l's iterate as D contiguous Reals.
  PYSHARP_HD const Real* point(int l) {
    const V* w = state_.point();
    if constexpr (W == 1) {
      return w;
    } else {
      for (int i = 0; i < m_.dim(); ++i) w_lane_[i] = lane(w[i], l);
      return w_lane_;
    }
  }

  const Model& m_;
  const EngineConfig& c_;
  int lanes_;
  State& state_;
  long long traj_[W];
  TrajectoryRecords<Real> out_[W];  // by value: drivers pass temporaries
  bool alive_[W], have_v1_[W];
  long long rec_[W], sh_[W], th_[W];  // records written so far, per lane
  Mask live_;
  V lr_, decay_, eta_;  // eta_: PGD's effective LR
  V qr_c_;              // Quasi-RMSprop's c
  V rms_v_ = V(Real(0));  // scalar RMSprop: running mean of ||grad L(w)||^2
  Real* v1_[W];
  Real *v_new_, *w_lane_, *lz_, *lz_eval_ = nullptr, *lz_resid_ = nullptr;
  Real* lz_top_ = nullptr;    // top_k >= 2: the top-k solve's scratch and outputs
  Real* lz_lanes_ = nullptr;  // W > 1: lockstep Lanczos Reals, then W eigenvectors
  Jet<Real, 1>* jets_;
  V* lane_scratch_;
  Jet<V, 1>* lane_jets_;
  bool on_sphere_ = false;
  long long next_rec_ = 0, next_sh_ = 0, next_th_ = 0;  // the next step of each event
  V loss_ = V(Real(0)), norm2_ = V(Real(0)), gnorm2_ = V(Real(0)), norm_ = V(Real(0)),
    eff_ = V(Real(0)), scale_ = V(Real(1));
};

// The steps at which anything is recorded: observations between them are
// not needed by the plain GD+WD update (which depends on w alone).
PYSHARP_HD inline bool is_event(const EngineConfig& c, long long t) {
  return t == c.steps || t % c.record_every == 0 ||
         (c.sharpness_every > 0 && t % c.sharpness_every == 0) ||
         (c.theta_every > 0 && t % c.theta_every == 0);
}

// Runs one trajectory from the state's initial point, step by step.
template <class Model, class State, class Real>
PYSHARP_HD void run_trajectory(const Model& m, const EngineConfig& c, long long traj,
                               State& state, const Hyperparameters<Real>& h,
                               const TrajectoryRecords<Real>& out, Real* scratch,
                               Jet<Real, 1>* jets) {
  TrajectoryRunner<Model, State, Real> runner(m, c, traj, state, h, out, scratch, jets);
  run_to_end(runner, c);
}

// Runs n independent runners (one trajectory or a lane block each) from their
// current states, step by step in alternation. A runner's arithmetic does not
// depend on n; alternating only gives the processor independent dependency
// chains to overlap, which is what a small model's step (one long latency
// chain through sqrt and division) needs.
template <class Runner>
PYSHARP_HD void run_to_end(Runner* runners, int n, const EngineConfig& c) {
  constexpr int kMax = 8;  // in flight at once; more run kMax at a time
  for (int first = 0; first < n; first += kMax) {
    Runner* r = runners + first;
    const int k = n - first < kMax ? n - first : kMax;
    bool going[kMax];
    for (int j = 0; j < k; ++j) going[j] = true;
    for (long long t = 0; t <= c.steps; ++t) {
      bool any_going = false;
      for (int j = 0; j < k; ++j)
        if (going[j]) going[j] = r[j].observe(t) && t != c.steps;
      for (int j = 0; j < k; ++j)
        if (going[j]) {
          going[j] = r[j].step(t);
          any_going = any_going || going[j];
        }
      if (!any_going) break;
    }
    for (int j = 0; j < k; ++j) r[j].finish();
  }
}

// Runs one runner from its current state.
template <class Runner>
PYSHARP_HD void run_to_end(Runner& runner, const EngineConfig& c) {
  run_to_end(&runner, 1, c);
}

}  // namespace pysharp
