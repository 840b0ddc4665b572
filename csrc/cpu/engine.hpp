// CPU drivers for the trajectory engine and batched Lanczos: one trajectory
// (or one point) per OpenMP iteration, scratch allocated once per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "pysharp/engine/bn_linreg_spectral.hpp"
#include "cpu/batched.hpp"
#include "pysharp/engine/lanczos.hpp"
#include "pysharp/engine/trajectory.hpp"

namespace pysharp::cpu {

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

  TrajectoryRecords<Real> row(long long b, long long B, int D) const {
    auto at = [b](auto* p) { return p ? p + b : p; };
    return {B,           at(loss),      at(norm2),   at(eff_lr),
            at(grad_norm), at(top_grad), at(sharpness), at(eos_ratio),
            at(sharpness_converged), theta ? theta + b * D : nullptr,
            w_final + b * D, diverged + b, diverged_step + b};
  }
};

// Runs B trajectories; trajectory b uses global index offset + b for its
// random streams and hyperparameters lr[b], wd[b]. make_state(w0, scratch)
// builds the trajectory's state in state_reals of scratch.
template <class Model, class Real, class MakeState>
void run_batch_with(const Model& m, const EngineConfig& c, const Real* W0, const Real* lr,
                    const Real* wd, long long B, long long offset,
                    const BatchRecords<Real>& out, long long state_reals,
                    MakeState&& make_state) {
  const int D = m.dim();
#pragma omp parallel if (B > 1)
  {
    std::vector<Real> state_scratch(state_reals);
    std::vector<Real> scratch(trajectory_scratch_reals(D, c));
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
    // Dynamic: diverging trajectories finish early; the schedule never changes bits.
#pragma omp for schedule(dynamic, 4)
    for (long long b = 0; b < B; ++b) {
      auto state = make_state(W0 + b * D, state_scratch.data());
      run_trajectory(m, c, offset + b, state, lr[b], wd[b], out.row(b, B, D),
                     scratch.data(), jets.data());
    }
  }
}

// Any model, any method: the iterate is stored in full.
template <class Model, class Real>
void run_batch(const Model& m, const EngineConfig& c, const Real* W0, const Real* lr,
               const Real* wd, long long B, long long offset, const BatchRecords<Real>& out) {
  run_batch_with(m, c, W0, lr, wd, B, offset, out,
                 FullSpaceState<Model, Real>::scratch_size(m),
                 [&m](const Real* w0, Real* scratch) {
                   return FullSpaceState<Model, Real>(m, w0, scratch);
                 });
}

// BN linear regression, GD+WD or scalar RMSprop without jitter: the exact
// reduced update in the singular basis of Xc.
template <class Real>
void run_batch_spectral(const BNLinearRegression<Real>& m, const BNLinRegSpectral<Real>& sp,
                        const EngineConfig& c, const Real* W0, const Real* lr, const Real* wd,
                        long long B, long long offset, const BatchRecords<Real>& out) {
  run_batch_with(m, c, W0, lr, wd, B, offset, out, SpectralState<Real>::scratch_size(sp),
                 [&sp](const Real* w0, Real* scratch) {
                   return SpectralState<Real>(sp, w0, scratch);
                 });
}

// Top-k eigenpairs of H(w) for each row of W (B, D). start: (B, D) or nullptr.
template <class Model, class Real>
void lanczos_batch(const Model& m, const LanczosOptions& o, const Real* W, const Real* start,
                   long long B, Real* evals, Real* evecs, Real* resid, int* iterations,
                   std::uint8_t* converged, std::uint8_t* ok) {
  const int D = m.dim();
  const int k = o.k;
#pragma omp parallel if (worth_threads(m, B * o.max_iter))
  {
    std::vector<Real> scratch(lanczos_scratch_size(D, o));
    std::vector<Jet<Real, 1>> jets(jet_scratch_size(m));
#pragma omp for schedule(dynamic, 4)
    for (long long b = 0; b < B; ++b) {
      LanczosOptions ob = o;
      ob.stream = static_cast<std::uint64_t>(b);
      const Real* w = W + b * D;
      auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, jets.data()); };
      const LanczosReport rep = lanczos(apply, D, ob, start ? start + b * D : nullptr,
                                        evals + b * k, evecs + b * k * D, resid + b * k,
                                        scratch.data());
      iterations[b] = rep.iterations;
      converged[b] = rep.converged;
      ok[b] = rep.ok;
    }
  }
}

}  // namespace pysharp::cpu
