// One optimisation trajectory on a scale-invariant model, start to finish:
// the update rule, metric recording, periodic spherical sharpness by Lanczos
// and divergence handling. Drivers (CPU OpenMP, CUDA) call run_trajectory
// once per trajectory; nothing here allocates.
#pragma once

#include <cstdint>

#include "pysharp/engine/lanczos.hpp"
#include "pysharp/engine/rng.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp {

enum class Method : int {
  gd_wd = 0,          // w+ = (1 - lr wd) w - lr grad L(w)
  pgd = 1,            // theta+ = Pi(theta - eta grad L(theta)), constant eta = lr
  pgd_adaptive = 2,   // as pgd, eta follows the GD+WD recursion (Lemma 3.1) from lr
  scalar_rmsprop = 3  // v+ = b v + (1-b) ||g||^2, w+ = (1 - lr wd) w - lr g / (sqrt(v+) + eps)
};

struct EngineConfig {
  Method method = Method::gd_wd;
  long long steps = 0;
  long long record_every = 1;
  long long sharpness_every = 0;  // 0: no sharpness tracking
  long long theta_every = 0;      // 0: no theta snapshots
  double jitter = 0.0;            // sigma: adds sigma ||w|| xi, xi ~ N(0, I/D)
  std::uint64_t seed = 0;
  double rms_beta = 0.99, rms_eps = 1e-12;
  LanczosOptions lanczos;         // k = 1; stream/counter set per call
};

// Where one trajectory's records go: element r of a record series is at
// base[r * stride] (stride = batch size, so arrays are (records, B)).
template <class Real>
struct TrajectoryRecords {
  long long stride;
  Real *loss, *norm2, *eff_lr, *grad_norm, *top_grad;  // per record step
  Real *sharpness, *eos_ratio;                         // per sharpness step
  std::uint8_t* sharpness_converged;                   // per sharpness step
  Real* theta;          // (n_theta, B, D): element r at theta[(r * stride) * D]
  Real* w_final;        // D
  std::uint8_t* diverged;
  long long* diverged_step;
};

PYSHARP_HD inline long long n_records(long long steps, long long every) {
  return every > 0 ? steps / every + 1 : 0;
}

template <class Real>
PYSHARP_HD bool all_finite(const Real* x, int n) {
  for (int i = 0; i < n; ++i)
    if (!(x[i] - x[i] == Real(0))) return false;  // NaN or inf
  return true;
}

template <class Real>
PYSHARP_HD bool is_finite(Real x) {
  return x - x == Real(0);
}

// How the engine sees an iterate. FullSpaceState stores w itself; other
// states (bn_linreg_spectral.hpp) carry an exact reduced representation.
// A state provides:
//   bool evaluate(Real& loss, Real& norm2, Real& gnorm2)  L, ||w||^2, ||grad L(w)||^2
//   const Real* point()                                   w (length D)
//   Real grad_dot(const Real* v)                          v . grad L(w)
//   bool advance(bool sphere, Real decay, Real step, Real norm, Real jitter_amp,
//                std::uint64_t seed, long long traj, long long t)
//       w+ = decay w - step grad L(w) + noise, or on the sphere
//       w+ = Pi(w / norm - step grad L(w) + noise); false if w+ is not finite
//       (the state then keeps w).
template <class Model, class Real>
struct FullSpaceState {
  const Model& m;
  Real* w;
  Real* g;  // gradient, then the next iterate
  Real* work;

  // Scratch: 2 D + work_size + 1 Reals.
  PYSHARP_HD FullSpaceState(const Model& model, const Real* w0, Real* scratch)
      : m(model), w(scratch), g(scratch + model.dim()), work(scratch + 2 * model.dim()) {
    for (int i = 0; i < m.dim(); ++i) w[i] = w0[i];
  }
  PYSHARP_HD static long long scratch_size(const Model& model) {
    return 2LL * model.dim() + model.work_size() + 1;
  }
  PYSHARP_HD bool evaluate(Real& loss, Real& norm2, Real& gnorm2) {
    const bool ok = m.loss_grad(w, &loss, g, work);
    norm2 = detail::dot(w, w, m.dim());
    gnorm2 = detail::dot(g, g, m.dim());
    return ok;
  }
  PYSHARP_HD const Real* point() const { return w; }
  PYSHARP_HD Real grad_dot(const Real* v) const { return detail::dot(v, g, m.dim()); }
  PYSHARP_HD bool advance(bool sphere, Real decay, Real step, Real norm, Real jitter_amp,
                          std::uint64_t seed, long long traj, long long t) {
    const int D = m.dim();
    if (sphere)
      for (int i = 0; i < D; ++i) g[i] = w[i] / norm - step * g[i];
    else
      for (int i = 0; i < D; ++i) g[i] = decay * w[i] - step * g[i];
    if (jitter_amp > Real(0))
      for (int i = 0; i < D; ++i)
        g[i] += jitter_amp * static_cast<Real>(normal(seed, static_cast<std::uint64_t>(traj),
                                                      static_cast<std::uint64_t>(t), i));
    if (sphere) {
      const Real n_next = sqrt_(detail::dot(g, g, D));
      for (int i = 0; i < D; ++i) g[i] /= n_next;
    }
    if (!all_finite(g, D)) return false;
    Real* swap = w;
    w = g;
    g = swap;
    return true;
  }
};

// Scratch (Reals) of run_trajectory besides the state's own: v1, the new
// eigenvector, Lanczos scratch and its two scalar outputs.
PYSHARP_HD inline long long trajectory_scratch_reals(int D, const EngineConfig& c) {
  return 2LL * D + lanczos_scratch_size(D, c.lanczos) + 2;
}

// Runs one trajectory from the state's initial point. m supplies the HVPs of
// Lanczos at state.point(). traj: the trajectory's global index (keys its
// random streams, so a batch split into chunks gives the same bits when each
// chunk passes its offset). jets: jet_scratch_size(m) order-1 jets.
template <class Model, class State, class Real>
PYSHARP_HD void run_trajectory(const Model& m, const EngineConfig& c, long long traj,
                               State& state, Real lr, Real wd,
                               const TrajectoryRecords<Real>& out, Real* scratch,
                               Jet<Real, 1>* jets) {
  const int D = m.dim();
  Real* v1 = scratch;
  Real* v_new = v1 + D;
  Real* lz = v_new + D;
  Real* lz_eval = lz + lanczos_scratch_size(D, c.lanczos);
  Real* lz_resid = lz_eval + 1;

  const bool on_sphere = c.method == Method::pgd || c.method == Method::pgd_adaptive;
  Real eta = lr;         // PGD: the effective LR
  Real rms_v = Real(0);  // scalar RMSprop: running mean of ||grad L(w)||^2
  const Real decay = Real(1) - lr * wd;
  bool have_v1 = false;
  long long rec = 0, sh = 0, th = 0;  // records written so far
  *out.diverged = 0;
  *out.diverged_step = -1;
  const long long S = out.stride;

  for (long long t = 0; t <= c.steps; ++t) {
    Real loss = Real(0), norm2 = Real(0), gnorm2 = Real(0);
    const bool defined = state.evaluate(loss, norm2, gnorm2);
    if (!defined || !is_finite(loss) || !is_finite(gnorm2) || !is_finite(norm2)) {
      *out.diverged = 1;
      *out.diverged_step = t;
      break;
    }
    const Real norm = sqrt_(norm2);
    // Effective LR of this step on the sphere: theta+ = Pi(theta - eff grad L(theta)).
    Real eff;
    if (on_sphere) {
      eff = eta;
    } else if (c.method == Method::scalar_rmsprop) {
      rms_v = Real(c.rms_beta) * rms_v + Real(1 - c.rms_beta) * gnorm2;
      eff = lr / ((sqrt_(rms_v) + Real(c.rms_eps)) * decay * norm2);
    } else {
      eff = lr / (decay * norm2);
    }

    if (c.sharpness_every > 0 && t % c.sharpness_every == 0) {
      LanczosOptions lo = c.lanczos;
      lo.k = 1;
      lo.stream = static_cast<std::uint64_t>(traj);
      lo.counter = static_cast<std::uint64_t>(t);
      const Real* w = state.point();
      auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets); };
      const LanczosReport rep = lanczos(apply, D, lo, have_v1 ? v1 : nullptr, lz_eval,
                                        v_new, lz_resid, lz);
      if (!rep.ok || !is_finite(*lz_eval)) {
        *out.diverged = 1;
        *out.diverged_step = t;
        break;
      }
      // Keep the eigenvector's sign continuous so top_grad shows the oscillation.
      const Real flip = (have_v1 && detail::dot(v_new, v1, D) < Real(0)) ? Real(-1) : Real(1);
      for (int i = 0; i < D; ++i) v1[i] = flip * v_new[i];
      have_v1 = true;
      const Real sharp = *lz_eval * norm2;  // S(w) = ||w||^2 lambda_1(H(w))
      out.sharpness[sh * S] = sharp;
      out.eos_ratio[sh * S] = eff * sharp;
      out.sharpness_converged[sh * S] = rep.converged;
      ++sh;
    }
    if (t % c.record_every == 0) {
      out.loss[rec * S] = loss;
      out.norm2[rec * S] = norm2;
      out.eff_lr[rec * S] = eff;
      out.grad_norm[rec * S] = norm * sqrt_(gnorm2);  // ||grad L(theta)|| = ||w|| ||grad L(w)||
      if (out.top_grad)
        out.top_grad[rec * S] = have_v1 ? norm * state.grad_dot(v1) : Real(0) / Real(0);
      ++rec;
    }
    if (c.theta_every > 0 && t % c.theta_every == 0) {
      const Real* w = state.point();
      Real* dst = out.theta + th * S * D;
      for (int i = 0; i < D; ++i) dst[i] = w[i] / norm;
      ++th;
    }
    if (t == c.steps) break;

    Real step;  // the coefficient of grad L(w) in the update
    if (on_sphere)
      step = eta * norm;  // theta - eta grad L(theta), grad L(theta) = ||w|| grad L(w)
    else if (c.method == Method::scalar_rmsprop)
      step = lr / (sqrt_(rms_v) + Real(c.rms_eps));
    else
      step = lr;
    const Real amp = c.jitter > 0 ? Real(c.jitter) * norm / sqrt_(Real(D)) : Real(0);
    if (!state.advance(on_sphere, decay, step, norm, amp, c.seed, traj, t)) {
      *out.diverged = 1;
      *out.diverged_step = t + 1;
      break;
    }
    if (c.method == Method::pgd_adaptive)  // 1/eta+ = (1 - lr wd)^2 (1/eta + eta ||grad L(theta)||^2)
      eta = Real(1) / (decay * decay * (Real(1) / eta + eta * norm2 * gnorm2));
  }

  // A diverged trajectory is frozen: its last finite iterate is kept and the
  // records it never reached are NaN.
  const Real nan = Real(0) / Real(0);
  const long long nrec = n_records(c.steps, c.record_every);
  const long long nsh = n_records(c.steps, c.sharpness_every);
  const long long nth = n_records(c.steps, c.theta_every);
  for (; rec < nrec; ++rec) {
    out.loss[rec * S] = out.norm2[rec * S] = out.eff_lr[rec * S] = nan;
    out.grad_norm[rec * S] = nan;
    if (out.top_grad) out.top_grad[rec * S] = nan;
  }
  for (; sh < nsh; ++sh) {
    out.sharpness[sh * S] = out.eos_ratio[sh * S] = nan;
    out.sharpness_converged[sh * S] = 0;
  }
  for (; th < nth; ++th)
    for (int i = 0; i < D; ++i) out.theta[th * S * D + i] = nan;
  const Real* w = state.point();
  for (int i = 0; i < D; ++i) out.w_final[i] = w[i];
}

}  // namespace pysharp
