// Device compilation of the model and engine headers.
//
// Until the CUDA engine lands (issue: GPU backends), this translation unit
// only proves that every model's loss, gradient, HVP and third-order
// contraction, and the whole trajectory engine with its Lanczos, compile as
// __device__ code from the very headers the CPU drivers use. Nothing here is
// launched yet.
#include <cstdint>

#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/derivatives.hpp"
#include "pysharp/models/toy3d.hpp"
#include "pysharp/engine/trajectory.hpp"

namespace pysharp::cuda_check {

// One thread per row; scratch holds scratch_stride elements per row.
template <class Model, class Real>
__global__ void loss_grad_rows(Model m, const Real* W, int B, Real* loss, Real* G,
                               Real* scratch, int scratch_stride, std::uint8_t* ok) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const long long D = m.dim();
  ok[b] = m.loss_grad(W + b * D, loss + b, G + b * D, scratch + b * scratch_stride);
}

template <class Model, class Real>
__global__ void derivative_rows(Model m, const Real* W, const Real* V, int B, Real* hv,
                                Real* t3, Jet<Real, 1>* s1, Jet<Real, 2>* s2,
                                int scratch_stride, std::uint8_t* ok) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const long long D = m.dim();
  ok[b] = hvp(m, W + b * D, V + b * D, hv + b * D, s1 + b * scratch_stride) &&
          third_contraction(m, W + b * D, V + b * D, t3 + b * D, s2 + b * scratch_stride);
}

template <class Model, class Real>
__global__ void trajectory_rows(Model m, EngineConfig c, const Real* W0, const Real* lr,
                                const Real* wd, int B, TrajectoryRecords<Real> out,
                                Real* scratch, long long stride, Jet<Real, 1>* jets,
                                int jet_stride) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  FullSpaceState<Model, Real> state(m, W0 + b * m.dim(), scratch + b * stride);
  run_trajectory(m, c, b, state, lr[b], wd[b], out, scratch + b * stride + state.scratch_size(m),
                 jets + b * jet_stride);
}

#define PYSHARP_INSTANTIATE(MODEL, REAL)                                                \
  template __global__ void trajectory_rows<MODEL<REAL>, REAL>(                         \
      MODEL<REAL>, EngineConfig, const REAL*, const REAL*, const REAL*, int,           \
      TrajectoryRecords<REAL>, REAL*, long long, Jet<REAL, 1>*, int);                  \
  template __global__ void loss_grad_rows<MODEL<REAL>, REAL>(                          \
      MODEL<REAL>, const REAL*, int, REAL*, REAL*, REAL*, int, std::uint8_t*);         \
  template __global__ void derivative_rows<MODEL<REAL>, REAL>(                         \
      MODEL<REAL>, const REAL*, const REAL*, int, REAL*, REAL*, Jet<REAL, 1>*,         \
      Jet<REAL, 2>*, int, std::uint8_t*);

PYSHARP_INSTANTIATE(BNLinearRegression, double)
PYSHARP_INSTANTIATE(BNLinearRegression, float)
PYSHARP_INSTANTIATE(BNMatrixCompletion, double)
PYSHARP_INSTANTIATE(BNMatrixCompletion, float)
PYSHARP_INSTANTIATE(Toy3D, double)
PYSHARP_INSTANTIATE(Toy3D, float)
#undef PYSHARP_INSTANTIATE

}  // namespace pysharp::cuda_check
