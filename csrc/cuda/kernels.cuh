// CUDA kernels over the shared model and engine headers.
//
// One thread per trajectory (or per point): every kernel calls the same
// PYSHARP_HD functions as the CPU drivers, so the math exists once. Why not
// a warp or block per trajectory: the models here have D <= a few hundred and
// a trajectory is a strictly sequential chain of small dot products, so
// intra-trajectory parallelism would pay a synchronisation per step for
// little work; the batch (10^4 - 10^6 trajectories) fills the GPU on its own.
// Each thread's scratch is one contiguous slice of a global buffer.
//
// Included by executor.cuh (pysharp._cuda) and, as source text, by the CuPy
// backend (cupy.RawModule): it must stay free of host-only code.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/engine/bn_linreg_spectral.hpp"
#include "pysharp/engine/lanczos.hpp"
#include "pysharp/engine/trajectory.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/bn_two_layer_net.hpp"
#include "pysharp/models/derivatives.hpp"
#include "pysharp/models/toy3d.hpp"

namespace pysharp::cuda {

__device__ inline long long thread_index() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// loss (B,), G (B, D); work: m.work_size() Reals per row.
template <class Model, class Real>
__global__ void loss_grad_kernel(Model m, const Real* W, long long B, Real* loss, Real* G,
                                 Real* work, std::uint8_t* ok) {
  const long long b = thread_index();
  if (b >= B) return;
  const int D = m.dim();
  ok[b] = m.loss_grad(W + b * D, loss + b, G + b * D, work + b * m.work_size());
}

// out = H v (N = 1) or D^3L[v, v] (N = 2); jets: jet_scratch_size(m) per row.
template <int N, class Model, class Real>
__global__ void directional_kernel(Model m, const Real* W, const Real* V, long long B,
                                   Real* out, Jet<Real, N>* jets, std::uint8_t* ok) {
  const long long b = thread_index();
  if (b >= B) return;
  const int D = m.dim();
  Jet<Real, N>* s = jets + b * jet_scratch_size(m);
  if constexpr (N == 1)
    ok[b] = hvp(m, W + b * D, V + b * D, out + b * D, s);
  else
    ok[b] = third_contraction(m, W + b * D, V + b * D, out + b * D, s);
}

// One thread per (point, column): H[b, :, j] = H(w_b) e_j. e: D Reals per thread.
template <class Model, class Real>
__global__ void hessian_kernel(Model m, const Real* W, long long B, Real* H, Real* e,
                               Real* col, Jet<Real, 1>* jets, std::uint8_t* bad) {
  const long long t = thread_index();
  const int D = m.dim();
  if (t >= B * D) return;
  const long long b = t / D, j = t % D;
  Real* et = e + t * D;
  Real* ct = col + t * D;
  for (int i = 0; i < D; ++i) et[i] = Real(i == j);
  if (!hvp(m, W + b * D, et, ct, jets + t * jet_scratch_size(m))) {
    bad[b] = 1;  // benign race: every writer stores 1
    return;
  }
  for (int i = 0; i < D; ++i) H[(b * D + i) * D + j] = ct[i];
}

// Top-k eigenpairs of H(w_b), random starts keyed by streams[b] (b if null) and
// o.counter; scratch: lanczos_scratch_size(D, o) Reals per row.
template <class Model, class Real>
__global__ void lanczos_kernel(Model m, LanczosOptions o, const Real* W, const Real* start,
                               const std::uint64_t* streams, long long B, Real* evals,
                               Real* evecs, Real* resid, int* iterations,
                               std::uint8_t* converged, std::uint8_t* ok, Real* scratch,
                               Jet<Real, 1>* jets) {
  const long long b = thread_index();
  if (b >= B) return;
  const int D = m.dim(), k = o.k;
  o.stream = streams ? streams[b] : static_cast<std::uint64_t>(b);
  const Real* w = W + b * D;
  Jet<Real, 1>* s = jets + b * jet_scratch_size(m);
  auto apply = [&](const Real* x, Real* y) { return hvp(m, w, x, y, s); };
  const LanczosReport rep =
      lanczos(apply, D, o, start ? start + b * D : nullptr, evals + b * k, evecs + b * k * D,
              resid + b * k, scratch + b * lanczos_scratch_size(D, o));
  iterations[b] = rep.iterations;
  converged[b] = rep.converged;
  ok[b] = rep.ok;
}

// Trajectories first .. first + count of a batch of B, iterate stored in full.
// state: FullSpaceState::scratch_size(m) Reals per thread; scratch:
// trajectory_scratch_reals(D, c) per thread; jets: jet_scratch_size(m).
template <class Model, class Real>
__global__ void trajectory_kernel(Model m, EngineConfig c, const Real* W0,
                                  Hyperparameters<Real> h, long long first, long long count,
                                  long long B, long long offset, BatchRecords<Real> out,
                                  Real* state, Real* scratch, Jet<Real, 1>* jets) {
  const long long i = thread_index();
  if (i >= count) return;
  const long long b = first + i;
  const int D = m.dim();
  FullSpaceState<Model, Real> st(m, W0 + b * D, state + i * FullSpaceState<Model, Real>::scratch_size(m));
  run_trajectory(m, c, offset + b, st, h.from(b), out.row(b, B, D),
                 scratch + i * trajectory_scratch_reals(D, c), jets + i * jet_scratch_size(m));
}

// BN linear regression, the exact reduced update (SpectralState), same layout.
template <class Real>
__global__ void spectral_trajectory_kernel(BNLinearRegression<Real> m, BNLinRegSpectral<Real> sp,
                                           EngineConfig c, const Real* W0,
                                           Hyperparameters<Real> h, long long first, long long count,
                                           long long B, long long offset,
                                           BatchRecords<Real> out, Real* state, Real* scratch,
                                           Jet<Real, 1>* jets) {
  const long long i = thread_index();
  if (i >= count) return;
  const long long b = first + i;
  const int D = m.dim();
  SpectralState<Real> st(sp, W0 + b * D, state + i * SpectralState<Real>::scratch_size(sp));
  run_trajectory(m, c, offset + b, st, h.from(b), out.row(b, B, D),
                 scratch + i * trajectory_scratch_reals(D, c), jets + i * jet_scratch_size(m));
}

}  // namespace pysharp::cuda
