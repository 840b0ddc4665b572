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

// Record arrays of a whole batch; each trajectory gets a strided view.
template <class Real>
struct BatchRecords {
  Real *loss, *norm2, *eff_lr, *grad_norm, *top_grad;
  Real *sharpness, *eos_ratio;
  std::uint8_t* sharpness_converged;
  Real* theta;
  Real* w_final;
  std::uint8_t* diverged;
  long long* diverged_step;

  PYSHARP_HD TrajectoryRecords<Real> row(long long b, long long B, int D) const {
    auto at = [b](auto* p) { return p ? p + b : p; };
    return {B,           at(loss),      at(norm2),   at(eff_lr),
            at(grad_norm), at(top_grad), at(sharpness), at(eos_ratio),
            at(sharpness_converged), theta ? theta + b * D : nullptr,
            w_final + b * D, diverged + b, diverged_step + b};
  }
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

// One trajectory as a sequence of observe(t) (measure and record step t) and
// step(t) (apply the update of step t) calls, so that drivers may advance
// several trajectories in lockstep between observations. m supplies the
// HVPs of Lanczos at state.point(). traj: the trajectory's global index (keys
// its random streams, so a batch split into chunks gives the same bits when
// each chunk passes its offset). scratch: trajectory_scratch_reals(D, c)
// Reals; jets: jet_scratch_size(m) order-1 jets.
template <class Model, class State, class Real>
class TrajectoryRunner {
 public:
  PYSHARP_HD TrajectoryRunner(const Model& m, const EngineConfig& c, long long traj,
                              State& state, Real lr, Real wd,
                              const TrajectoryRecords<Real>& out, Real* scratch,
                              Jet<Real, 1>* jets)
      : m_(m), c_(c), traj_(traj), state_(state), lr_(lr), decay_(Real(1) - lr * wd),
        eta_(lr), out_(out), v1_(scratch), v_new_(scratch + m.dim()),
        lz_(scratch + 2 * m.dim()), jets_(jets) {
    lz_eval_ = lz_ + lanczos_scratch_size(m.dim(), c.lanczos);
    lz_resid_ = lz_eval_ + 1;
    on_sphere_ = c.method == Method::pgd || c.method == Method::pgd_adaptive;
    *out.diverged = 0;
    *out.diverged_step = -1;
  }

  PYSHARP_HD bool diverged() const { return *out_.diverged != 0; }

  // Marks the trajectory diverged at step t (its state is kept as it is).
  PYSHARP_HD void flag(long long t) {
    *out_.diverged = 1;
    *out_.diverged_step = t;
  }

  PYSHARP_HD bool observe(long long t) {
    const int D = m_.dim();
    const long long S = out_.stride;
    const bool defined = state_.evaluate(loss_, norm2_, gnorm2_);
    if (!defined || !is_finite(loss_) || !is_finite(gnorm2_) || !is_finite(norm2_)) {
      flag(t);
      return false;
    }
    norm_ = sqrt_(norm2_);
    // Effective LR of this step on the sphere: theta+ = Pi(theta - eff grad L(theta)).
    if (on_sphere_) {
      eff_ = eta_;
    } else if (c_.method == Method::scalar_rmsprop) {
      rms_v_ = Real(c_.rms_beta) * rms_v_ + Real(1 - c_.rms_beta) * gnorm2_;
      eff_ = lr_ / ((sqrt_(rms_v_) + Real(c_.rms_eps)) * decay_ * norm2_);
    } else {
      eff_ = lr_ / (decay_ * norm2_);
    }
    if (c_.sharpness_every > 0 && t % c_.sharpness_every == 0) {
      LanczosOptions lo = c_.lanczos;
      lo.k = 1;
      lo.stream = static_cast<std::uint64_t>(traj_);
      lo.counter = static_cast<std::uint64_t>(t);
      const Real* w = state_.point();
      Jet<Real, 1>* jets = jets_;
      const Model& m = m_;
      auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets); };
      const LanczosReport rep = lanczos(apply, D, lo, have_v1_ ? v1_ : nullptr, lz_eval_,
                                        v_new_, lz_resid_, lz_);
      if (!rep.ok || !is_finite(*lz_eval_)) {
        flag(t);
        return false;
      }
      // Keep the eigenvector's sign continuous so top_grad shows the oscillation.
      const Real flip =
          (have_v1_ && detail::dot(v_new_, v1_, D) < Real(0)) ? Real(-1) : Real(1);
      for (int i = 0; i < D; ++i) v1_[i] = flip * v_new_[i];
      have_v1_ = true;
      const Real sharp = *lz_eval_ * norm2_;  // S(w) = ||w||^2 lambda_1(H(w))
      out_.sharpness[sh_ * S] = sharp;
      out_.eos_ratio[sh_ * S] = eff_ * sharp;
      out_.sharpness_converged[sh_ * S] = rep.converged;
      ++sh_;
    }
    if (t % c_.record_every == 0) {
      out_.loss[rec_ * S] = loss_;
      out_.norm2[rec_ * S] = norm2_;
      out_.eff_lr[rec_ * S] = eff_;
      out_.grad_norm[rec_ * S] = norm_ * sqrt_(gnorm2_);  // ||grad L(theta)|| = ||w|| ||grad L(w)||
      if (out_.top_grad)
        out_.top_grad[rec_ * S] = have_v1_ ? norm_ * state_.grad_dot(v1_) : Real(0) / Real(0);
      ++rec_;
    }
    if (c_.theta_every > 0 && t % c_.theta_every == 0) {
      const Real* w = state_.point();
      Real* dst = out_.theta + th_ * S * D;
      for (int i = 0; i < D; ++i) dst[i] = w[i] / norm_;
      ++th_;
    }
    return true;
  }

  // The update of step t, after observe(t).
  PYSHARP_HD bool step(long long t) {
    Real step;  // the coefficient of grad L(w) in the update
    if (on_sphere_)
      step = eta_ * norm_;  // theta - eta grad L(theta), grad L(theta) = ||w|| grad L(w)
    else if (c_.method == Method::scalar_rmsprop)
      step = lr_ / (sqrt_(rms_v_) + Real(c_.rms_eps));
    else
      step = lr_;
    const Real amp =
        c_.jitter > 0 ? Real(c_.jitter) * norm_ / sqrt_(Real(m_.dim())) : Real(0);
    if (!state_.advance(on_sphere_, decay_, step, norm_, amp, c_.seed, traj_, t)) {
      flag(t + 1);
      return false;
    }
    if (c_.method == Method::pgd_adaptive)  // 1/eta+ = (1 - lr wd)^2 (1/eta + eta ||grad L(theta)||^2)
      eta_ = Real(1) / (decay_ * decay_ * (Real(1) / eta_ + eta_ * norm2_ * gnorm2_));
    return true;
  }

  // A diverged trajectory is frozen: its last finite iterate is kept and the
  // records it never reached are NaN.
  PYSHARP_HD void finish() {
    const int D = m_.dim();
    const long long S = out_.stride;
    const Real nan = Real(0) / Real(0);
    const long long nrec = n_records(c_.steps, c_.record_every);
    const long long nsh = n_records(c_.steps, c_.sharpness_every);
    const long long nth = n_records(c_.steps, c_.theta_every);
    for (; rec_ < nrec; ++rec_) {
      out_.loss[rec_ * S] = out_.norm2[rec_ * S] = out_.eff_lr[rec_ * S] = nan;
      out_.grad_norm[rec_ * S] = nan;
      if (out_.top_grad) out_.top_grad[rec_ * S] = nan;
    }
    for (; sh_ < nsh; ++sh_) {
      out_.sharpness[sh_ * S] = out_.eos_ratio[sh_ * S] = nan;
      out_.sharpness_converged[sh_ * S] = 0;
    }
    for (; th_ < nth; ++th_)
      for (int i = 0; i < D; ++i) out_.theta[th_ * S * D + i] = nan;
    const Real* w = state_.point();
    for (int i = 0; i < D; ++i) out_.w_final[i] = w[i];
  }

 private:
  const Model& m_;
  const EngineConfig& c_;
  long long traj_;
  State& state_;
  Real lr_, decay_, eta_;  // eta_: PGD's effective LR
  Real rms_v_ = Real(0);   // scalar RMSprop: running mean of ||grad L(w)||^2
  TrajectoryRecords<Real> out_;  // by value: drivers pass temporaries
  Real *v1_, *v_new_, *lz_, *lz_eval_ = nullptr, *lz_resid_ = nullptr;
  Jet<Real, 1>* jets_;
  bool on_sphere_ = false, have_v1_ = false;
  long long rec_ = 0, sh_ = 0, th_ = 0;  // records written so far
  Real loss_ = Real(0), norm2_ = Real(0), gnorm2_ = Real(0), norm_ = Real(0), eff_ = Real(0);
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
                               State& state, Real lr, Real wd,
                               const TrajectoryRecords<Real>& out, Real* scratch,
                               Jet<Real, 1>* jets) {
  TrajectoryRunner<Model, State, Real> runner(m, c, traj, state, lr, wd, out, scratch, jets);
  for (long long t = 0; t <= c.steps; ++t) {
    if (!runner.observe(t) || t == c.steps || !runner.step(t)) break;
  }
  runner.finish();
}

}  // namespace pysharp
