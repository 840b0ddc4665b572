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

template <class Model>
PYSHARP_HD long long trajectory_scratch_reals(const Model& m, const EngineConfig& c) {
  const int D = m.dim();
  // w, g (also the next w), v1, the new eigenvector, model work, Lanczos scratch,
  // and its two scalar outputs (eigenvalue, residual).
  return 4LL * D + m.work_size() + 1 + lanczos_scratch_size(D, c.lanczos) + 2;
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

// traj: the trajectory's global index (keys its random streams, so a batch
// split into chunks gives the same bits when each chunk passes its offset).
// jets: jet_scratch_size(m) order-1 jets for the HVPs of Lanczos.
template <class Model, class Real>
PYSHARP_HD void run_trajectory(const Model& m, const EngineConfig& c, long long traj,
                               const Real* w0, Real lr, Real wd,
                               const TrajectoryRecords<Real>& out, Real* scratch,
                               Jet<Real, 1>* jets) {
  const int D = m.dim();
  Real* w = scratch;
  Real* g = w + D;
  Real* v1 = g + D;
  Real* v_new = v1 + D;
  Real* work = v_new + D;
  Real* lz = work + m.work_size() + 1;
  Real* lz_eval = lz + lanczos_scratch_size(D, c.lanczos);
  Real* lz_resid = lz_eval + 1;
  for (int i = 0; i < D; ++i) w[i] = w0[i];

  const bool on_sphere = c.method == Method::pgd || c.method == Method::pgd_adaptive;
  if (on_sphere) {  // start exactly on the sphere
    const Real n0 = sqrt_(detail::dot(w, w, D));
    for (int i = 0; i < D; ++i) w[i] /= n0;
  }
  Real eta = lr;         // PGD: the effective LR
  Real rms_v = Real(0);  // scalar RMSprop: running mean of ||grad L(w)||^2
  const Real decay = Real(1) - lr * wd;
  bool have_v1 = false;
  long long rec = 0, sh = 0, th = 0;  // records written so far
  *out.diverged = 0;
  *out.diverged_step = -1;
  const long long S = out.stride;

  for (long long t = 0; t <= c.steps; ++t) {
    Real loss = Real(0);
    const bool defined = m.loss_grad(w, &loss, g, work);
    const Real norm2 = detail::dot(w, w, D);
    const Real gnorm2 = detail::dot(g, g, D);
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
        out.top_grad[rec * S] = have_v1 ? norm * detail::dot(v1, g, D) : Real(0) / Real(0);
      ++rec;
    }
    if (c.theta_every > 0 && t % c.theta_every == 0) {
      Real* dst = out.theta + th * S * D;
      for (int i = 0; i < D; ++i) dst[i] = w[i] / norm;
      ++th;
    }
    if (t == c.steps) break;

    // The next iterate is built in g, then swapped in if it is finite.
    if (on_sphere) {
      const Real step = eta * norm;  // theta - eta grad L(theta), grad L(theta) = ||w|| g
      for (int i = 0; i < D; ++i) g[i] = w[i] / norm - step * g[i];
    } else {
      const Real step = c.method == Method::scalar_rmsprop
                            ? lr / (sqrt_(rms_v) + Real(c.rms_eps))
                            : lr;
      for (int i = 0; i < D; ++i) g[i] = decay * w[i] - step * g[i];
    }
    if (c.jitter > 0) {
      const Real amp = Real(c.jitter) * norm / sqrt_(Real(D));
      for (int i = 0; i < D; ++i)
        g[i] += amp * static_cast<Real>(normal(c.seed, static_cast<std::uint64_t>(traj),
                                               static_cast<std::uint64_t>(t), i));
    }
    if (on_sphere) {
      const Real n_next = sqrt_(detail::dot(g, g, D));
      for (int i = 0; i < D; ++i) g[i] /= n_next;
      if (c.method == Method::pgd_adaptive)  // 1/eta+ = (1 - lr wd)^2 (1/eta + eta ||grad L(theta)||^2)
        eta = Real(1) / (decay * decay * (Real(1) / eta + eta * norm2 * gnorm2));
    }
    if (!all_finite(g, D)) {
      *out.diverged = 1;
      *out.diverged_step = t + 1;
      break;
    }
    Real* swap = w;
    w = g;
    g = swap;
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
  for (int i = 0; i < D; ++i) out.w_final[i] = w[i];
}

}  // namespace pysharp
